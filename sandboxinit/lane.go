package sandboxinit

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Interactive first: the heavy background operations (session create,
// fork, restore, refresh, archive, destroy, publish capture and commit,
// squash, base import) run through one bounded FIFO lane, at most
// Config.BackgroundLanes at once, on threads with a lower CPU weight
// (nice Config.BackgroundNice). Everything else — exec and command I/O,
// file operations, reads, diffs, the views — never waits on it: with 50
// agents creating sessions and publishing, a command or a file read is
// not queued behind a capture or a runc init.

// DefaultBackgroundNice is the nice value of a background operation's
// thread: weight 110 against 1024 for an interactive thread (CFS), so
// under contention interactive work gets ~9x the CPU, and alone a
// background operation still runs at full speed.
const DefaultBackgroundNice = 10

// DefaultBackgroundQueueWait is how long a background operation may wait
// for the lane before it is refused with server_busy (which the workflow
// layer retries).
const DefaultBackgroundQueueWait = time.Minute

// backgroundOps are the RPC operations that go through the lane.
// publish_workspace_session with verify does not (laned): it holds no CPU
// while its command runs, and a ten-minute test must not keep session
// creates out. Nor does recover_workspace_session: it settles a publish
// under the transaction's lock, which a verified publish holds while it
// verifies — a slot must not wait on that.
var backgroundOps = map[string]bool{
	"create_workspace_session": true, "restore_workspace_session": true, "destroy_workspace_session": true,
	"archive_idle_sessions": true, "refresh_workspace_session": true,
	"publish_workspace_session": true, "publish_prepare": true, "publish_commit": true,
	"publish_finalize": true, "publish_abort": true,
	"squash_layerstack": true, "init_base": true,
}

// laned reports whether the RPC op with this body runs in the lane.
func laned(op string, body []byte) bool {
	if !backgroundOps[op] {
		return false
	}
	if op == "publish_workspace_session" {
		var v struct {
			Verify json.RawMessage `json:"verify"`
		}
		// Lenient: a body the handler will refuse is laned and refused there.
		if json.Unmarshal(body, &v) == nil && len(v.Verify) > 0 && string(v.Verify) != "null" {
			return false
		}
	}
	return true
}

// defaultLanes is max(1, NumCPU/2): on a 2-core sandbox one background
// operation at a time, the other core for interactive work.
func defaultLanes() int { return max(1, goruntime.NumCPU()/2) }

// lane is a bounded FIFO admission gate: at most slots holders at once,
// waiters served in arrival order, a wait ends with the caller's context or
// after maxWait (server_busy).
type lane struct {
	slots   int
	maxWait time.Duration
	nice    int // >0: holders run on a thread of this nice value (run)
	log     *slog.Logger

	mu      sync.Mutex
	running int
	queue   list.List // of *laneWaiter, oldest first
	st      laneCounters
	niceErr sync.Once
}

type laneWaiter struct {
	ready   chan struct{} // closed when the slot is handed to this waiter
	granted bool          // under lane.mu
}

type laneCounters struct {
	admitted, queued, refused, cancelled uint64
	waitTotal, waitMax                   time.Duration
}

func newLane(slots int, maxWait time.Duration, nice int, log *slog.Logger) *lane {
	if slots <= 0 {
		slots = defaultLanes()
	}
	if maxWait <= 0 {
		maxWait = DefaultBackgroundQueueWait
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &lane{slots: slots, maxWait: maxWait, nice: nice, log: log}
}

// acquire takes a slot, waiting in FIFO order; it returns the release (run
// it once) and how long it waited. A wait past maxWait is server_busy; a
// cancelled context is its error. Neither holds a slot.
func (l *lane) acquire(ctx context.Context) (func(), time.Duration, error) {
	t0 := time.Now()
	l.mu.Lock()
	if l.running < l.slots && l.queue.Len() == 0 {
		l.running++
		l.st.admitted++
		l.mu.Unlock()
		return l.releaser(), 0, nil
	}
	w := &laneWaiter{ready: make(chan struct{})}
	el := l.queue.PushBack(w)
	l.st.queued++
	depth := l.queue.Len()
	l.mu.Unlock()

	timer := time.NewTimer(l.maxWait)
	defer timer.Stop()
	var cause error
	select {
	case <-w.ready:
	case <-ctx.Done():
		cause = ctx.Err()
	case <-timer.C:
		cause = api.Errorf(api.KindServerBusy, map[string]any{"lane": "background", "slots": l.slots, "queued": depth,
			"waited_ms": time.Since(t0).Milliseconds(), "max_wait_ms": l.maxWait.Milliseconds()},
			"the daemon's background lane is full (%d running, %d queued): retry later", l.slots, depth)
	}
	waited := time.Since(t0)
	l.mu.Lock()
	if cause != nil && !w.granted {
		l.queue.Remove(el)
		if api.AsError(cause).Kind == api.KindServerBusy {
			l.st.refused++
		} else {
			l.st.cancelled++
		}
		l.mu.Unlock()
		return nil, waited, cause
	}
	// Granted (possibly just as the wait ended: the slot is ours, keep it).
	l.st.admitted++
	l.st.waitTotal += waited
	l.st.waitMax = max(l.st.waitMax, waited)
	l.mu.Unlock()
	return l.releaser(), waited, nil
}

// releaser hands the slot to the oldest waiter, or frees it.
func (l *lane) releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if front := l.queue.Front(); front != nil {
				w := l.queue.Remove(front).(*laneWaiter)
				w.granted = true // the slot passes on: running stays
				close(w.ready)
				return
			}
			l.running--
		})
	}
}

// run runs fn holding a slot, on a thread of lower CPU weight.
func (l *lane) run(ctx context.Context, fn func(ctx context.Context) (any, error)) (any, time.Duration, error) {
	release, waited, err := l.acquire(ctx)
	if err != nil {
		return nil, waited, err
	}
	defer release()
	var res any
	runNiced(l.nice, func(err error) {
		l.niceErr.Do(func() {
			l.log.Warn("background work runs at normal CPU weight: setpriority refused", "nice", l.nice, "err", err)
		})
	}, func() { res, err = fn(ctx) })
	return res, waited, err
}

// laneStats is the lane as the daemon view shows it.
type laneStats struct {
	Slots       int     `json:"slots"`
	Running     int     `json:"running"`
	Queued      int     `json:"queued"`
	Nice        int     `json:"nice"`
	MaxWaitMs   int64   `json:"max_wait_ms"`
	Admitted    uint64  `json:"admitted"`
	Waited      uint64  `json:"waited"`
	Refused     uint64  `json:"refused_busy"`
	Cancelled   uint64  `json:"cancelled"`
	WaitMeanMs  float64 `json:"wait_mean_ms"`
	WaitLongest float64 `json:"wait_longest_ms"`
}

func (l *lane) stats() laneStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := laneStats{Slots: l.slots, Running: l.running, Queued: l.queue.Len(), Nice: max(l.nice, 0), MaxWaitMs: l.maxWait.Milliseconds(),
		Admitted: l.st.admitted, Waited: l.st.queued, Refused: l.st.refused, Cancelled: l.st.cancelled,
		WaitLongest: float64(l.st.waitMax.Microseconds()) / 1000}
	if n := l.st.queued - l.st.refused - l.st.cancelled; n > 0 {
		s.WaitMeanMs = float64(l.st.waitTotal.Microseconds()) / 1000 / float64(n)
	}
	return s
}

// runNiced runs fn to completion on a fresh OS thread whose nice value is
// nice (nice <= 0: on the caller's goroutine, as is). The thread is locked
// to a goroutine that exits while locked, so the Go runtime destroys the
// thread with it: its nice value never serves another goroutine. Threads
// the runtime starts meanwhile come from its template thread, not from
// this one (a locked M never clones itself), so they are not niced either.
// A process forked on this thread would inherit the nice value: code that
// starts a session's processes runs them through unniced. A panic in fn is
// re-raised on the caller's goroutine.
func runNiced(nice int, refused func(error), fn func()) {
	if nice <= 0 {
		fn()
		return
	}
	onThread(func() {
		goruntime.LockOSThread() // never unlocked: see above
		if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), nice); err != nil && refused != nil {
			refused(err)
		}
		fn()
	})
}

// unniced runs fn on a goroutine of its own: never on a niced background
// thread (those run only their own goroutine), so processes fn forks — a
// session's init, the commands it starts — get the daemon's CPU weight.
func unniced(fn func() error) error {
	var err error
	onThread(func() { err = fn() })
	return err
}

// onThread runs fn on a new goroutine and waits for it, re-raising a panic.
func onThread(fn func()) {
	done := make(chan any, 1)
	go func() {
		panicked := true
		defer func() {
			if panicked {
				p := recover()
				if p == nil {
					p = fmt.Errorf("runtime.Goexit in a background operation")
				}
				done <- p
			}
		}()
		fn()
		panicked = false
		done <- nil
	}()
	if p := <-done; p != nil {
		panic(p)
	}
}
