// Package sigdefault gives the processes a Go program starts every signal
// at its default, whatever started the program.
//
// SIG_IGN survives execve. Go's runtime installs its own handler for almost
// every signal, and execve resets a handled signal to its default in the new
// program, but it keeps an inherited SIG_IGN for SIGHUP and SIGINT (a program
// started under nohup, or in the background by a shell without job control,
// stays immune to them). Its children would then inherit the SIG_IGN too: a
// session's ^C, a command's trap on INT or a terminal's hangup would do
// nothing.
package sigdefault

import (
	"os"
	"os/signal"
	"syscall"
)

// ForChildren makes the program's children start with SIGHUP and SIGINT at
// their defaults. A signal that was ignored stays without effect on the
// program itself: it is caught and dropped instead of ignored, and the
// child's execve resets a caught signal to its default. A signal the program
// did not ignore is left alone.
func ForChildren() {
	for _, s := range []os.Signal{syscall.SIGHUP, syscall.SIGINT} {
		if signal.Ignored(s) {
			signal.Notify(make(chan os.Signal, 1), s)
		}
	}
}
