package command

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Defaults for Options.
const (
	DefaultMaxBytes         = 8 << 20
	DefaultKillGrace        = 100 * time.Millisecond
	DefaultDrainGrace       = 100 * time.Millisecond
	DefaultStdinDeadline    = 2 * time.Second
	DefaultMaxResponseBytes = 256 << 10
	DefaultRows             = 24
	DefaultCols             = 80
	DefaultMaxRunning       = 512
	DefaultOutputBudget     = 256 << 20
	DefaultMaxLingering     = 256
)

// yieldLines caps the lines one yield returns (the tail; the rest is paged
// with Read).
const yieldLines = api.MaxReadLimit

// Options configures an Engine; zero values take the defaults.
type Options struct {
	Retained  int           // finished commands kept (default api.RetainedCommands)
	MaxBytes  int64         // per-command output kept in memory (default 8 MiB)
	KillGrace time.Duration // SIGTERM -> SIGKILL (default 100ms, the seed's)
	Now       func() time.Time

	// DrainGrace is how long output is still collected after the main
	// process exited while another process (a background child) holds the
	// output pipes open (default 100ms).
	DrainGrace time.Duration
	// StdinDeadline bounds one stdin write (default 2s, the seed's).
	StdinDeadline time.Duration
	// MaxResponseBytes caps the line text in one response (default 256 KiB);
	// at least one line is always returned.
	MaxResponseBytes int
	// MaxRunning caps the commands running at once (default 512); one more
	// is refused with resource_exhausted.
	MaxRunning int
	// OutputBudget caps the memory all commands' output holds together
	// (default 256 MiB, running commands included, counted by the arrays'
	// capacity). Past it the oldest finished commands lose their output
	// first (reading one says output_dropped); then the running commands
	// keep less than MaxBytes, the largest cut first, down to their newest
	// lines (reads say truncated). See doc.go for the one exception.
	OutputBudget int64
	// MaxLingering caps the output pipes still drained for background
	// children after their command ended (default 256; a command has up to
	// two). Past it the oldest is closed: a child that writes to it again
	// gets EPIPE (SIGPIPE). Each costs a descriptor and a goroutine, and
	// none counts against MaxRunning.
	MaxLingering int
	Log          *slog.Logger
}

// Meta is what the caller attaches to a command.
type Meta struct {
	WorkspaceSessionID string
	// Started is called once the command runs and Active lists it, before
	// Start yields: a caller that admitted the command under a lock
	// releases it here, so OnExit may take that lock.
	Started func()
	// OnExit is called once, from the command's goroutine and without engine
	// locks, when the command reached a terminal state and its final output
	// is recorded (Active no longer lists it). out is the terminal response
	// with the tail of the output; changing it changes nothing. No response
	// shows the terminal state before OnExit returned (yields and Read wait
	// for it), so what it attaches with SetResult is in every one; it must
	// not block on what a Start caller holds until Started.
	OnExit func(id string, out *api.CommandOutput)
}

// Engine runs commands and keeps their output.
type Engine struct {
	opts Options

	mu        sync.Mutex
	cmds      map[string]*command
	finished  []string     // terminal commands, oldest first
	running   int          // admitted and not yet retired
	finBytes  int64        // output memory the finished commands hold (part of total)
	total     atomic.Int64 // output memory all commands hold, running ones too
	runMax    atomic.Int64 // output a running command may keep now: MaxBytes, less while the budget is short
	closed    bool
	lingering []*os.File     // output pipes still held by background children, oldest first
	wg        sync.WaitGroup // commands not yet finalized
	bufs      sync.Pool      // *[readBufBytes]byte
}

// New returns an Engine.
func New(opts Options) *Engine {
	if opts.Retained <= 0 {
		opts.Retained = api.RetainedCommands
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.KillGrace <= 0 {
		opts.KillGrace = DefaultKillGrace
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.DrainGrace <= 0 {
		opts.DrainGrace = DefaultDrainGrace
	}
	if opts.StdinDeadline <= 0 {
		opts.StdinDeadline = DefaultStdinDeadline
	}
	if opts.MaxResponseBytes <= 0 {
		opts.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if opts.MaxRunning <= 0 {
		opts.MaxRunning = DefaultMaxRunning
	}
	if opts.OutputBudget <= 0 {
		opts.OutputBudget = DefaultOutputBudget
	}
	if opts.MaxLingering <= 0 {
		opts.MaxLingering = DefaultMaxLingering
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{opts: opts, cmds: map[string]*command{},
		bufs: sync.Pool{New: func() any { return new([readBufBytes]byte) }}}
	e.runMax.Store(opts.MaxBytes)
	return e
}

// Start runs a command and waits up to its yield time for it to finish; it
// returns the output so far.
func (e *Engine) Start(ctx context.Context, start Starter, args api.ExecCommandArgs, meta Meta) (*api.CommandOutput, error) {
	callStart := e.opts.Now()
	if strings.TrimSpace(args.Cmd) == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "cmd is required")
	}
	env, err := envList(args.Env)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	timeout := clampMS(args.TimeoutMS, api.DefaultTimeoutMS, 1, api.MaxTimeoutMS)
	yield := clampMS(args.YieldTimeMS, api.DefaultYieldTimeMS, 0, api.MaxYieldTimeMS)

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, api.Errorf(api.KindShuttingDown, nil, "command engine is shutting down")
	}
	if e.running >= e.opts.MaxRunning {
		e.mu.Unlock()
		return nil, api.Errorf(api.KindResourceExhausted, map[string]any{"limit": "max_running_commands", "max": e.opts.MaxRunning},
			"the sandbox already runs %d commands (max_running_commands); wait for some to end or cancel them", e.opts.MaxRunning)
	}
	e.running++
	e.wg.Add(1)
	e.mu.Unlock()

	c, err := newCommand(e, newID(), args.TTY, meta)
	if err != nil {
		e.unadmit()
		return nil, fmt.Errorf("start command: %w", err)
	}
	spec := c.spec(args, env)
	c.started = e.opts.Now()
	proc, err := start(context.WithoutCancel(ctx), spec)
	if err != nil {
		c.closePipes()
		e.unadmit()
		e.opts.Log.Warn("command start failed", "command_session_id", c.id, "workspace_session_id", meta.WorkspaceSessionID, "error", err)
		return nil, fmt.Errorf("start command: %w", err)
	}
	c.proc = proc

	e.mu.Lock()
	for e.cmds[c.id] != nil { // 64 random bits: practically never
		c.id = newID()
	}
	e.cmds[c.id] = c
	closed := e.closed
	e.mu.Unlock()

	c.run(timeout)
	if closed { // Shutdown began while we were starting: it did not see us.
		c.terminate(api.StatusCancelled, e.opts.KillGrace)
	}
	if meta.Started != nil {
		meta.Started()
	}
	return e.yield(ctx, c, yield, callStart), nil
}

// Active returns the ids of a workspace session's running commands, oldest
// first.
func (e *Engine) Active(workspaceSessionID string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var active []*command
	for _, c := range e.cmds {
		if c.meta.WorkspaceSessionID == workspaceSessionID && c.running() {
			active = append(active, c)
		}
	}
	sort.Slice(active, func(i, j int) bool { return active[i].started.Before(active[j].started) })
	ids := make([]string, len(active))
	for i, c := range active {
		ids[i] = c.id
	}
	return ids
}

// SetResult records f to be applied to every later response about command
// id (the daemon attaches an implicit session's publish outcome this way).
// An unknown id is ignored.
func (e *Engine) SetResult(id string, f func(out *api.CommandOutput)) {
	c, err := e.lookup(id)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.results = append(c.results, f)
	c.mu.Unlock()
}

// Shutdown stops admitting commands, sends SIGTERM to every running one,
// SIGKILL to those still running after grace, and waits (up to ctx) until all
// reached a terminal state. Output pipes held by background children of
// finished commands are closed.
func (e *Engine) Shutdown(ctx context.Context, grace time.Duration) {
	e.mu.Lock()
	e.closed = true
	var running []*command
	for _, c := range e.cmds {
		running = append(running, c)
	}
	e.mu.Unlock()
	for _, c := range running {
		c.terminate(api.StatusCancelled, grace)
	}
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	e.mu.Lock()
	for _, f := range e.lingering {
		_ = f.Close()
	}
	e.lingering = nil
	e.mu.Unlock()
}

func (e *Engine) lookup(id string) (*command, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.cmds[id]; c != nil {
		return c, nil
	}
	return nil, api.Errorf(api.KindNotFound, map[string]any{"command_session_id": id}, "command not found: %s", id)
}

// unadmit undoes Start's admission of a command that never ran.
func (e *Engine) unadmit() {
	e.mu.Lock()
	e.running--
	e.mu.Unlock()
	e.wg.Done()
}

// retire records that c reached its terminal state holding bytes of
// output (already in total), evicts the oldest finished commands beyond the
// retention limit, and trims to the output budget. What the budget has
// spare now is shared out again among the running commands.
func (e *Engine) retire(c *command, bytes int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.running--
	e.finished = append(e.finished, c.id)
	e.finBytes += bytes
	for len(e.finished) > e.opts.Retained {
		if old := e.cmds[e.finished[0]]; old != nil {
			n := old.keptBytes()
			e.finBytes -= n
			e.total.Add(-n)
		}
		delete(e.cmds, e.finished[0])
		e.finished = e.finished[1:]
	}
	e.trimLocked()
	if m := e.runMax.Load(); m < e.opts.MaxBytes {
		if spare := e.opts.OutputBudget - e.total.Load(); spare > 0 {
			e.runMax.Store(min(e.opts.MaxBytes, m+spare/int64(e.running+1)))
		}
	}
}

// account adds delta bytes of output memory a command now holds, and trims
// when that takes the engine past its output budget. No command lock is
// held.
func (e *Engine) account(delta int64) {
	if e.total.Add(delta) <= e.opts.OutputBudget {
		return
	}
	e.mu.Lock()
	e.trimLocked()
	e.mu.Unlock()
}

// trimLocked brings the output all commands hold back within the budget:
// first the oldest finished commands lose theirs, then the running ones
// keep less (limitRunningLocked). e.mu is held.
func (e *Engine) trimLocked() {
	for _, id := range e.finished {
		if e.finBytes == 0 || e.total.Load() <= e.opts.OutputBudget {
			break
		}
		if old := e.cmds[id]; old != nil {
			n := old.dropOutput(e.opts.OutputBudget)
			e.finBytes -= n
			e.total.Add(-n)
		}
	}
	if e.total.Load() > e.opts.OutputBudget {
		e.limitRunningLocked()
	}
}

// minRunMax is the least output limitRunningLocked lets a running command
// keep: a long line's worth. (A command always keeps its newest line and
// its unterminated tails, whatever its limit.)
const minRunMax = maxLineBytes

// limitRunningLocked lowers the output a running command may keep (runMax)
// to what the budget leaves after the finished commands, shared out by
// water level: commands holding less keep all of it, the largest are cut
// to the same level, their oldest lines dropped as MaxBytes drops them. It
// aims an eighth below the budget, so the next cut is that much output
// away; a command keeps runMax from then on, without the engine. Before,
// running output was not limited by the budget at all: 20 commands
// printing 50 MB each and sleeping held 352 MiB after GC with a budget of
// 256 MiB. e.mu is held.
func (e *Engine) limitRunningLocked() {
	if e.runMax.Load() <= minRunMax {
		return // as low as it goes: a command keeps its newest line anyway
	}
	var run []*command
	var held []int64
	for _, c := range e.cmds {
		if c.running() {
			run = append(run, c)
			held = append(held, c.keptBytes())
		}
	}
	if len(run) == 0 {
		return
	}
	target := e.opts.OutputBudget - e.opts.OutputBudget/8 - e.finBytes
	level := waterLevel(held, target)
	// A store holds up to about 1.25 × what it keeps.
	max := max(minRunMax, min(e.runMax.Load(), level-level/5))
	e.runMax.Store(max)
	e.opts.Log.Info("output budget short: running commands keep less", "output_budget", e.opts.OutputBudget, "running_max_bytes", max)
	for i, c := range run {
		if held[i] > level || held[i] > max+max/2 {
			e.total.Add(c.limitOutput(max))
		}
	}
}

// waterLevel is the level at which cutting every amount in held down to it
// makes them sum to at most target (0 when target is 0 or less).
func waterLevel(held []int64, target int64) int64 {
	if target <= 0 {
		return 0
	}
	sorted := slices.Clone(held)
	slices.Sort(sorted)
	left := target
	for i, h := range sorted {
		share := left / int64(len(sorted)-i)
		if h > share {
			return share
		}
		left -= h
	}
	return sorted[len(sorted)-1] + left
}

// linger tracks an output pipe a background child still holds; false means
// the engine is shut down and f must be closed now. Past MaxLingering it
// closes the oldest tracked pipe: the drain reading it ends, and its child
// gets EPIPE if it writes again. Without a cap every `sleep 3000 &` kept
// two descriptors and two goroutines until the child ended.
func (e *Engine) linger(f *os.File, on bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !on {
		if i := slices.Index(e.lingering, f); i >= 0 {
			e.lingering = slices.Delete(e.lingering, i, i+1)
		}
		return true
	}
	if e.closed {
		return false
	}
	e.lingering = append(e.lingering, f)
	if n := len(e.lingering) - e.opts.MaxLingering; n > 0 {
		for _, old := range e.lingering[:n] {
			e.opts.Log.Info("closing a lingering output pipe", "max_lingering", e.opts.MaxLingering)
			_ = old.Close()
		}
		e.lingering = slices.Delete(e.lingering, 0, n)
	}
	return true
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return "cmd_" + hex.EncodeToString(b[:])
}

// clampMS turns an optional millisecond count into a duration: nil or below
// lo gives def, above hi gives hi.
func clampMS(v *int64, def, lo, hi int64) time.Duration {
	ms := def
	if v != nil && *v >= lo {
		ms = *v
	}
	if ms > hi {
		ms = hi
	}
	return time.Duration(ms) * time.Millisecond
}

// CheckEnv refuses an environment no command can be started with (an
// empty name, "=" or NUL in a name, NUL in a value), as a start would:
// callers check it before they make anything for the command.
func CheckEnv(env map[string]string) error {
	_, err := envList(env)
	return err
}

func envList(env map[string]string) ([]string, error) {
	list := make([]string, 0, len(env))
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "env", "env": k}, "invalid environment variable %q: a name is not empty and holds no \"=\" or NUL, a value holds no NUL", k)
		}
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	return list, nil
}

func notRunning(id string) error {
	return api.Errorf(api.KindOperationFailed, map[string]any{"command_session_id": id}, "command is not running")
}
