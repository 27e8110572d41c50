package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/ephemeral-sandbox/sandbox/internal/sigdefault"
)

// TestMain: the test host's commands start with SIGHUP and SIGINT at their
// defaults, as the daemon's do (cmd/sandbox-daemon), even when the test
// binary was started with them ignored (from a shell's background job
// without job control, or nohup): TestTTYCtrlCIsSIGINT's trap needs it.
func TestMain(m *testing.M) {
	sigdefault.ForChildren()
	os.Exit(m.Run())
}

// host starts commands on the test host with os/exec: its own process group
// without a TTY, its own session with the pty as controlling terminal with
// one (so ^C from the terminal is SIGINT). Cleanup kills every group it
// started, background children included.
type host struct {
	mu    sync.Mutex
	procs []*hostProc
}

func newHost(tb testing.TB) *host {
	h := &host{}
	tb.Cleanup(h.killAll)
	return h
}

func (h *host) killAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.procs {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
}

func (h *host) start(_ context.Context, spec Spec) (Process, error) {
	cmd := exec.Command(spec.Args[0], spec.Args[1:]...)
	cmd.Env = append(os.Environ(), spec.Env...)
	cmd.Dir = spec.Cwd
	p := &hostProc{cmd: cmd}
	if spec.TTY {
		cmd.Env = append(cmd.Env, "TERM=xterm")
		ptmx, err := pty.StartWithAttrs(cmd, &pty.Winsize{Rows: spec.Rows, Cols: spec.Cols},
			&syscall.SysProcAttr{Setsid: true, Setctty: true})
		if err != nil {
			return nil, err
		}
		p.pty = ptmx
		p.copied = make(chan struct{})
		go func() { _, _ = io.Copy(spec.Stdout, ptmx); close(p.copied) }()
		go func() { _, _ = io.Copy(ptmx, spec.Stdin) }()
	} else {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = spec.Stdin, spec.Stdout, spec.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
	}
	p.pid = cmd.Process.Pid
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	return p, nil
}

type hostProc struct {
	cmd    *exec.Cmd
	pid    int
	pty    *os.File
	copied chan struct{}
}

func (p *hostProc) Pid() int { return p.pid }

func (p *hostProc) Wait() (int, error) {
	err := p.cmd.Wait()
	if p.pty != nil {
		// The terminal's output ends when every process holding the slave is
		// gone; a background child may hold it longer (no test leaves one:
		// the bound is for a loaded machine, whose copy may be late).
		select {
		case <-p.copied:
		case <-time.After(10 * time.Second):
		}
		_ = p.pty.Close()
		<-p.copied
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return -int(ws.Signal()), nil
		}
		return ws.ExitStatus(), nil
	default:
		return 0, err
	}
}

func (p *hostProc) Signal(sig os.Signal) error {
	err := syscall.Kill(-p.pid, sig.(syscall.Signal))
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

func (p *hostProc) Resize(rows, cols uint16) error {
	if p.pty == nil {
		return fmt.Errorf("resize %d: no terminal", p.pid)
	}
	return pty.Setsize(p.pty, &pty.Winsize{Rows: rows, Cols: cols})
}
