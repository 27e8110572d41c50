package sandboxinit

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Supervise is PID 1 of the sandbox container. It starts the daemon as its
// child ("serve"), reaps every orphan (session inits left behind by a
// daemon restart, daemonised processes), forwards SIGTERM and SIGINT to the
// daemon, and restarts the daemon if it dies without being asked to: the
// sessions keep running meanwhile and the new daemon re-attaches them.
// Keeping PID 1 separate from the daemon is what lets the daemon use
// ordinary waits on its own children without a global reaper stealing them.
func Supervise(args []string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "pid1")
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD, syscall.SIGQUIT)
	stopping := false
	backoff := 100 * time.Millisecond
	for {
		// Process 1 is the container's entrypoint, so the daemon runs in
		// the sandbox's own network namespace: guard it (an explicit
		// --ingress-guard among args comes later and wins).
		cmd := exec.Command(self, append([]string{"serve", "--ingress-guard=on"}, args...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		started := time.Now()
		if err := cmd.Start(); err != nil {
			log.Error("start daemon", "err", err)
			return 1
		}
		pid := cmd.Process.Pid
		code, exited := -1, false
		for !exited {
			s := <-sigs
			switch s {
			case syscall.SIGCHLD:
				code, exited = reap(pid)
			default:
				stopping = true
				_ = cmd.Process.Signal(s)
			}
		}
		if stopping {
			syscall.Sync()
			return code
		}
		log.Error(api.DaemonRestartLog, "exit_code", code, "ran", time.Since(started).String())
		if time.Since(started) > 30*time.Second {
			backoff = 100 * time.Millisecond
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 5*time.Second)
		for len(sigs) > 0 {
			if s := <-sigs; s != syscall.SIGCHLD {
				stopping = true
			}
		}
		if stopping {
			return code
		}
	}
}

// reap collects every exited child and reports whether the daemon (pid)
// was among them, with its exit code.
func reap(pid int) (int, bool) {
	code, found := -1, false
	for {
		var ws syscall.WaitStatus
		p, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if p <= 0 || errors.Is(err, syscall.ECHILD) {
			return code, found
		}
		if p == pid {
			found = true
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
		}
	}
}
