package command

import (
	"context"
	"io"
	"os"
)

// Process is a started command; the session runtime's process type satisfies it.
type Process interface {
	Pid() int
	// Wait returns the exit code, or -N when signal N killed the process. An
	// error means the exit status is unknown; the engine reports exit code 128.
	Wait() (exitCode int, err error)
	// Signal delivers sig to the whole process group. It is called after
	// Wait returned only while the command is still draining its output.
	Signal(sig os.Signal) error
	// Resize sets the window size of a TTY process.
	Resize(rows, cols uint16) error
}

// Spec is what a Starter needs to create a command's process.
//
// Stdin, Stdout and Stderr are the engine's pipe ends, each an *os.File: a
// starter may hand them to the process as they are (the fast path, no copying)
// or copy through them. Either way it must not close them and must not write
// to Stdout or Stderr after the process's Wait returned: the engine closes its
// write ends then and seals the output.
type Spec struct {
	Args       []string // ["/bin/sh", "-c", cmd]
	Env        []string // "KEY=value", sorted
	Cwd        string
	TTY        bool
	Rows, Cols uint16 // TTY only; never zero
	Stdin      io.Reader
	Stdout     io.Writer // with TTY the starter copies the pty master here
	Stderr     io.Writer // nil with TTY
}

// Starter creates a command's process. ctx carries the request's values but
// is never cancelled: a command outlives the request that started it, and the
// engine ends processes with Signal, never through ctx.
type Starter func(ctx context.Context, spec Spec) (Process, error)
