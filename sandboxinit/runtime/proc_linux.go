package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultWaitDelay bounds how long Wait keeps copying output after the
// process exited, when a background child still holds its stdout or stderr.
const DefaultWaitDelay = 250 * time.Millisecond

// ProcSpec describes a process to start in a running session.
type ProcSpec struct {
	Args []string
	Env  []string // on top of the session's environment
	Cwd  string   // default /workspace

	// Stdin, Stdout and Stderr: an *os.File is handed to the process as is;
	// any other value is copied through a pipe. A nil Stdin gives a pipe the
	// caller writes through Proc.Stdin; a nil Stdout or Stderr is /dev/null.
	Stdin          io.Reader
	Stdout, Stderr io.Writer

	// TTY allocates a pseudo-terminal of Rows x Cols inside the session; the
	// process's stdin, stdout and stderr are its slave end, Stdout receives
	// everything and Stderr is unused.
	TTY        bool
	Rows, Cols uint16

	// ViaInit asks the session init (SessionInitMain) to fork the process
	// instead of entering the session through libcontainer: several times
	// faster, same namespaces, cgroup, capabilities and no_new_privs; no TTY.
	ViaInit bool

	// WaitDelay is how long Wait keeps copying output after the process
	// exited (0 = DefaultWaitDelay). Output written later by background
	// children is dropped.
	WaitDelay time.Duration
}

func (p *ProcSpec) validate() error {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return fmt.Errorf("%w: empty args", ErrInvalidSpec)
	}
	if p.TTY && p.ViaInit {
		return fmt.Errorf("%w: a TTY process cannot be started via the session init", ErrInvalidSpec)
	}
	return nil
}

// Proc is a process started by Session.Exec. Its process group is the
// process itself (it runs setsid), so Signal reaches its children too.
type Proc struct {
	pid   int
	io    *stdio
	pty   *os.File
	stdin io.WriteCloser

	reaped atomic.Bool   // the pid may be reused: signal nothing any more
	done   chan struct{} // closed after exit and output drained
	code   int
	err    error
}

// Pid returns the process's pid in the sandbox's pid namespace; 0 for a
// ViaInit process that had already exited when Exec returned.
func (p *Proc) Pid() int { return p.pid }

// Stdin returns the writer feeding the process's stdin when ProcSpec.Stdin
// was nil, else nil. Close it to send end-of-file: a process that reads its
// stdin waits until then. For a TTY it writes to the terminal and Close
// sends ^D.
func (p *Proc) Stdin() io.WriteCloser { return p.stdin }

// Wait waits for the process to exit and its output to be copied; it returns
// the exit code, or minus the signal number when a signal killed it.
func (p *Proc) Wait() (exitCode int, err error) {
	<-p.done
	return p.code, p.err
}

// Signal sends sig to the process's group. After the process was reaped it
// returns os.ErrProcessDone.
func (p *Proc) Signal(sig os.Signal) error {
	s, ok := sig.(unix.Signal)
	if !ok {
		return fmt.Errorf("signal %v: not a unix signal", sig)
	}
	if p.reaped.Load() || p.pid <= 0 {
		return os.ErrProcessDone
	}
	if err := unix.Kill(-p.pid, s); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return os.ErrProcessDone
		}
		return fmt.Errorf("signal %d: %w", p.pid, err)
	}
	return nil
}

// Resize sets the terminal size of a TTY process.
func (p *Proc) Resize(rows, cols uint16) error {
	if p.pty == nil {
		return fmt.Errorf("resize %d: %w: no TTY", p.pid, ErrInvalidSpec)
	}
	ws := &unix.Winsize{Row: rows, Col: cols}
	if err := unix.IoctlSetWinsize(int(p.pty.Fd()), unix.TIOCSWINSZ, ws); err != nil {
		return fmt.Errorf("resize %d: %w", p.pid, err)
	}
	return nil
}

// Exec starts a process in the session. ctx governs the process like
// exec.CommandContext: when ctx is done before the process exits, its
// process group is killed.
func (s *Session) Exec(ctx context.Context, ps ProcSpec) (*Proc, error) {
	if err := ps.validate(); err != nil {
		return nil, err
	}
	if err := s.alive(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ps.Cwd == "" {
		ps.Cwd = "/workspace"
	}
	env := mergeEnv(defaultEnv, s.spec.Env, ps.Env)
	if ps.TTY && !hasEnv(env, "TERM") {
		env = append(env, "TERM=xterm")
	}
	if ps.ViaInit {
		return s.execViaInit(ctx, ps, env)
	}
	sio, err := newStdio(ps, false)
	if err != nil {
		return nil, err
	}
	pa := procArgs{args: ps.Args, env: env, cwd: ps.Cwd, io: sio.child}
	if s.c.preloaded() {
		// Through this binary by descriptor, which loads the precompiled
		// filter and execs the command (SessionExecMain).
		pa.args = append([]string{"/proc/self/fd/4", "sessexec", "--"}, ps.Args...)
		pa.env = append(append([]string(nil), env...), seccompFDEnv+"=3", exeFDEnv+"=4")
		pa.io.extra = append([]*os.File{s.r.seccomp.compiled, s.r.exe}, pa.io.extra...)
	}
	lp, err := s.c.run(pa, false)
	if err != nil {
		sio.abort()
		if !s.c.running() {
			return nil, fmt.Errorf("exec in %s: %w: %v", s.spec.ID, ErrGone, err)
		}
		return nil, fmt.Errorf("exec in %s: %w", s.spec.ID, err)
	}
	sio.started()
	p := newProc(lp.pid, sio)
	if lp.pty != nil {
		p.pty = lp.pty
		p.stdin = sio.attachPTY(lp.pty, ps)
	}
	go p.run(ctx, ps.WaitDelay, lp.wait)
	return p, nil
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if len(kv) > len(key) && kv[:len(key)] == key && kv[len(key)] == '=' {
			return true
		}
	}
	return false
}

func newProc(pid int, sio *stdio) *Proc {
	return &Proc{pid: pid, io: sio, stdin: sio.stdinW, done: make(chan struct{})}
}

// run waits for the process (wait returns its exit code), kills its group
// if ctx ends first, then drains output for at most delay.
func (p *Proc) run(ctx context.Context, delay time.Duration, wait func() (int, error)) {
	stop := context.AfterFunc(ctx, func() {
		if !p.reaped.Load() && p.pid > 0 {
			_ = unix.Kill(-p.pid, unix.SIGKILL)
		}
	})
	p.code, p.err = wait()
	p.reaped.Store(true)
	stop()
	if delay <= 0 {
		delay = DefaultWaitDelay
	}
	p.io.finish(delay)
	if p.pty != nil {
		_ = p.pty.Close()
	}
	close(p.done)
}
