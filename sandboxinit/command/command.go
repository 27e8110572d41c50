package command

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// readBufBytes is the size of one read from an output pipe.
const readBufBytes = 32 << 10

// command is one command's process, pipes and output.
type command struct {
	e       *Engine
	id      string
	tty     bool
	meta    Meta
	proc    Process   // set before the command is published in Engine.cmds
	started time.Time // idem

	stdin     *os.File // the engine's write end of the stdin pipe
	stdinR    *os.File // the read end handed to the starter; closed at the end
	stdinMu   sync.Mutex
	stdinOnce sync.Once
	outR      []*os.File // read ends: stdout, and stderr without TTY
	outW      []*os.File // write ends handed to the starter; closed after Wait
	timer     *time.Timer

	exited    chan struct{} // closed when the terminal state is recorded
	finalized chan struct{} // closed after OnExit returned

	mu       sync.Mutex
	out      output
	status   string // api.StatusRunning until terminal
	exitCode int
	reason   string // api.StatusCancelled or api.StatusTimedOut once the engine ends it
	ended    time.Time
	cursor   int // the next line a yield returns
	results  []func(*api.CommandOutput)
	// dropped is set when the engine dropped the finished command's output
	// to stay within its output budget (the budget, for the marker).
	dropped int64
}

func newCommand(e *Engine, id string, tty bool, meta Meta) (*command, error) {
	c := &command{e: e, id: id, tty: tty, meta: meta, status: api.StatusRunning,
		exited: make(chan struct{}), finalized: make(chan struct{})}
	c.out.lines.max = e.opts.MaxBytes
	newPipe := handOverPipe
	if tty {
		// The runtime copies a TTY command's stdin and output between these
		// ends and the pty itself: they stay pollable (a copy blocked in
		// read must not hold a thread, and must end when the pipe closes).
		newPipe = func(bool) (*os.File, *os.File, error) { return os.Pipe() }
	}
	var err error
	if c.stdinR, c.stdin, err = newPipe(true); err != nil {
		return nil, err
	}
	streams := 2
	if tty {
		streams = 1
	}
	for range streams {
		r, w, err := newPipe(false)
		if err != nil {
			c.closePipes()
			return nil, err
		}
		c.outR, c.outW = append(c.outR, r), append(c.outW, w)
	}
	return c, nil
}

// handOverPipe is os.Pipe for a command that is not a TTY's, with the end
// the process gets (the read end when childReads, else the write end) left
// blocking and out of the Go poller: the starter only hands it over (by
// Fd, which makes it blocking anyway), nothing here reads or writes it.
// That saves an exec three epoll registrations and their removal, about a
// tenth of the daemon's CPU per short command (measured). The daemon's end
// is non-blocking and pollable, as os.Pipe makes it.
func handOverPipe(childReads bool) (r, w *os.File, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	ours := p[1]
	if !childReads {
		ours = p[0]
	}
	if err := syscall.SetNonblock(ours, true); err != nil {
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return nil, nil, os.NewSyscallError("setnonblock", err)
	}
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}

func (c *command) spec(args api.ExecCommandArgs, env []string) Spec {
	s := Spec{Args: []string{"/bin/sh", "-c", args.Cmd}, Env: env, Cwd: args.Cwd, TTY: c.tty,
		Stdin: c.stdinR, Stdout: c.outW[0]}
	if c.tty {
		s.Rows, s.Cols = args.Rows, args.Cols
		if s.Rows == 0 {
			s.Rows = DefaultRows
		}
		if s.Cols == 0 {
			s.Cols = DefaultCols
		}
	} else {
		s.Stderr = c.outW[1]
	}
	return s
}

func (c *command) closePipes() {
	for _, f := range append([]*os.File{c.stdin, c.stdinR}, append(c.outR, c.outW...)...) {
		if f != nil {
			_ = f.Close()
		}
	}
}

// run starts the timeout, the output readers and the supervisor.
func (c *command) run(timeout time.Duration) {
	c.timer = time.AfterFunc(timeout, func() { c.terminate(api.StatusTimedOut, c.e.opts.KillGrace) })
	caughtUp := make([]chan struct{}, len(c.outR))
	for i, r := range c.outR {
		caughtUp[i] = make(chan struct{})
		go c.read(r, stream(i), caughtUp[i])
	}
	go c.supervise(caughtUp)
}

// supervise waits for the main process, then for the output: until the pipes
// hit EOF, or for DrainGrace when another process (a background child) still
// holds them. Then it records the terminal state.
func (c *command) supervise(caughtUp []chan struct{}) {
	code, err := c.proc.Wait()
	c.timer.Stop() // it exited in time; only cancel or shutdown can still end it
	for _, w := range c.outW {
		_ = w.Close()
	}
	deadline := time.Now().Add(c.e.opts.DrainGrace)
	for _, r := range c.outR {
		_ = r.SetReadDeadline(deadline)
	}
	for _, ch := range caughtUp {
		<-ch
	}
	c.finish(code, err)
}

// read collects one output pipe until EOF or until the drain deadline; after
// the deadline it discards what background children still write, so they do
// not get SIGPIPE, until they close the pipe, the engine closes it to stay
// within MaxLingering (Engine.linger), or the engine shuts down.
func (c *command) read(r *os.File, st stream, caughtUp chan struct{}) {
	err := c.collect(r, st)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		_ = r.SetReadDeadline(time.Time{})
		c.collectBuffered(r, st)
		close(caughtUp)
		if c.e.linger(r, true) {
			_, _ = io.Copy(io.Discard, r)
			c.e.linger(r, false)
		}
		_ = r.Close()
		return
	}
	if !errors.Is(err, io.EOF) {
		c.e.opts.Log.Warn("command output read failed", "command_session_id", c.id, "stream", st.String(), "error", err)
	}
	_ = r.Close()
	close(caughtUp)
}

// collect reads r into the output until an error (io.EOF at the end).
func (c *command) collect(r *os.File, st stream) error {
	// A pooled buffer: most commands print little, and a fresh one per pipe
	// (or a goroutine stack grown to hold one) costs more than the rest of
	// the engine's work for a command.
	bp := c.e.bufs.Get().(*[readBufBytes]byte)
	defer c.e.bufs.Put(bp)
	for {
		n, err := r.Read(bp[:])
		if n > 0 {
			c.record(st, bp[:n])
		}
		if err != nil {
			return err
		}
	}
}

// maxBufferedDrain bounds collectBuffered: more than a pipe holds (64 KiB
// by default), so only a writer still going past the deadline meets it.
const maxBufferedDrain = 1 << 20

// collectBuffered records what r already holds, without waiting for more:
// output the command wrote before its main process exited, which a reader
// the scheduler held back past the drain deadline has not read yet (a
// read past the deadline fails without looking at the pipe). Only the
// wait for background children ends at the deadline, not the command's
// own output.
func (c *command) collectBuffered(r *os.File, st stream) {
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	bp := c.e.bufs.Get().(*[readBufBytes]byte)
	defer c.e.bufs.Put(bp)
	_ = rc.Read(func(fd uintptr) bool {
		if fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
			return true // a blocking pipe would wait for a writer
		}
		for total := 0; total < maxBufferedDrain; {
			n, err := unix.Read(int(fd), bp[:])
			if err == unix.EINTR {
				continue
			}
			if n <= 0 || err != nil {
				break // empty (EAGAIN), or every writer gone (0)
			}
			c.record(st, bp[:n])
			total += n
		}
		return true
	})
}

// record adds p, read from stream st, to the output, keeping at most what
// the engine lets a running command keep now.
func (c *command) record(st stream, p []byte) {
	c.mu.Lock()
	before := c.out.held()
	c.out.lines.max = c.e.runMax.Load()
	c.out.write(st, p)
	delta := c.out.held() - before
	c.mu.Unlock()
	if delta != 0 {
		c.e.account(delta)
	}
}

// finish records the terminal state, retires the command and calls OnExit.
func (c *command) finish(code int, waitErr error) {
	c.mu.Lock()
	before := c.out.held()
	c.out.flush()
	c.ended = c.e.opts.Now()
	switch {
	case c.reason == api.StatusCancelled:
		c.status, c.exitCode = api.StatusCancelled, api.ExitCancelled
	case c.reason == api.StatusTimedOut:
		c.status, c.exitCode = api.StatusTimedOut, api.ExitTimeout
	case waitErr != nil:
		c.status, c.exitCode = api.StatusError, 128 // the seed's runner fallback
	case code == 0:
		c.status, c.exitCode = api.StatusOK, 0
	default:
		c.status, c.exitCode = api.StatusError, code
	}
	c.out.lines.shrink()
	close(c.exited)
	var final *api.CommandOutput
	if c.meta.OnExit != nil {
		final = c.render(c.tailWindow(0), 0)
		if final.Truncated {
			final.CommandSessionID = c.id
		}
	}
	results := append([]func(*api.CommandOutput){}, c.results...)
	kept := c.out.held()
	c.mu.Unlock()

	if waitErr != nil {
		c.e.opts.Log.Warn("command wait failed", "command_session_id", c.id, "error", waitErr)
	}
	c.closeStdin()
	_ = c.stdinR.Close()
	c.e.account(kept - before)
	c.e.retire(c, kept)
	if c.meta.OnExit != nil {
		for _, f := range results {
			f(final)
		}
		c.meta.OnExit(c.id, final)
	}
	close(c.finalized)
	c.e.wg.Done()
}

// terminate ends a running command on behalf of the engine (reason is the
// terminal status it will get): SIGTERM to the process group now, SIGKILL
// after grace. The first reason wins; a finished command is left alone.
func (c *command) terminate(reason string, grace time.Duration) {
	c.mu.Lock()
	if c.status != api.StatusRunning || c.reason != "" {
		c.mu.Unlock()
		return
	}
	c.reason = reason
	c.mu.Unlock()
	_ = c.proc.Signal(syscall.SIGTERM)
	time.AfterFunc(grace, func() {
		select {
		case <-c.exited:
		default:
			_ = c.proc.Signal(syscall.SIGKILL)
		}
	})
}

// settle waits, when the command has ended, until OnExit returned, and
// reports whether its terminal state may be shown: false while OnExit
// still runs (ctx ended first). A running command is settled.
func (c *command) settle(ctx context.Context) bool {
	if !isClosed(c.exited) {
		c.mu.Lock()
		ended := c.status != api.StatusRunning
		c.mu.Unlock()
		if !ended {
			return true
		}
	}
	select {
	case <-c.finalized:
		return true
	case <-ctx.Done():
		return isClosed(c.finalized)
	}
}

// keptBytes is what the command's output costs in the budget: the memory
// it holds.
func (c *command) keptBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.held()
}

// dropOutput discards the finished command's retained lines (offsets and
// counts stay) and returns the bytes freed; budget is named in the marker
// that reads show from now on.
func (c *command) dropOutput(budget int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.out.held()
	if n > 0 {
		c.out.lines.dropAll()
		c.dropped = budget
	}
	return n
}

// limitOutput makes the running command keep at most max bytes of output
// from now on (see Engine.limitRunningLocked), dropping its oldest lines as
// MaxBytes does, and returns the change in what it holds (zero or less). A
// command that ended meanwhile is left alone.
func (c *command) limitOutput(max int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != api.StatusRunning {
		return 0
	}
	before := c.out.held()
	c.out.lines.limit(max)
	return c.out.held() - before
}

func (c *command) running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status == api.StatusRunning
}

func (c *command) closeStdin() {
	c.stdinOnce.Do(func() { _ = c.stdin.Close() })
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
