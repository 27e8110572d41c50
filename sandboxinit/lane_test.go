package sandboxinit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// waitQueued yields until the lane has n waiters (no deadline of its own:
// the test's timeout ends a hang).
func waitQueued(l *lane, n int) {
	for l.stats().Queued != n {
		goruntime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

func TestLaneServesWaitersInArrivalOrder(t *testing.T) {
	l := newLane(1, time.Hour, 0, nil)
	release, waited, err := l.acquire(context.Background())
	require.NoError(t, err)
	require.Zero(t, waited, "a free slot is taken at once")

	const n = 8
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, _, err := l.acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			rel()
		}()
		waitQueued(l, i+1) // the next one arrives after this one queued
	}
	st := l.stats()
	require.Equal(t, 1, st.Running)
	require.Equal(t, n, st.Queued)
	release()
	release() // idempotent: a second call must not free a slot it no longer holds
	wg.Wait()
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, order)
	st = l.stats()
	require.Equal(t, 0, st.Running, "every slot came back")
	require.Equal(t, 0, st.Queued)
	require.Equal(t, uint64(n+1), st.Admitted)
	require.Equal(t, uint64(n), st.Waited)
}

func TestLaneBoundsConcurrency(t *testing.T) {
	l := newLane(3, time.Hour, 0, nil)
	var rels []func()
	for i := 0; i < 3; i++ {
		rel, _, err := l.acquire(context.Background())
		require.NoError(t, err)
		rels = append(rels, rel)
	}
	got := acquireLater(t, l)
	waitQueued(l, 1)
	select {
	case <-got:
		t.Fatal("a fourth holder got in past three slots")
	default:
	}
	rels[1]()
	(<-got)()
	rels[0]()
	rels[2]()
	require.Equal(t, 0, l.stats().Running)
}

func TestLaneCancelledWaiterHoldsNothing(t *testing.T) {
	l := newLane(1, time.Hour, 0, nil)
	release, _, err := l.acquire(context.Background())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() {
		_, _, err := l.acquire(ctx)
		cancelled <- err
	}()
	waitQueued(l, 1)
	next := acquireLater(t, l)
	waitQueued(l, 2)
	cancel()
	require.ErrorIs(t, <-cancelled, context.Canceled)
	waitQueued(l, 1) // the cancelled waiter left the queue
	release()        // the slot goes to the waiter behind it, not to the one that left
	rel := <-next
	require.Equal(t, 1, l.stats().Running)
	rel()
	st := l.stats()
	require.Equal(t, 0, st.Running)
	require.Equal(t, uint64(1), st.Cancelled)
}

func TestLaneRefusesPastMaxWaitWithServerBusy(t *testing.T) {
	l := newLane(1, 20*time.Millisecond, 0, nil)
	release, _, err := l.acquire(context.Background())
	require.NoError(t, err)
	_, _, err = l.acquire(context.Background())
	var ae *api.Error
	require.True(t, errors.As(err, &ae), "%v", err)
	require.Equal(t, api.KindServerBusy, ae.Kind, "retryable by the workflow layer")
	require.Equal(t, "background", ae.Details["lane"])
	require.Equal(t, 1, ae.Details["slots"])
	require.Equal(t, uint64(1), l.stats().Refused)
	require.Equal(t, 0, l.stats().Queued)
	release()
	rel, _, err := l.acquire(context.Background())
	require.NoError(t, err, "the refused waiter took no slot")
	rel()
}

func TestLanedClassifiesOperations(t *testing.T) {
	for _, op := range []string{"create_workspace_session", "publish_workspace_session", "publish_prepare", "publish_commit",
		"squash_layerstack", "init_base", "archive_idle_sessions", "restore_workspace_session", "destroy_workspace_session"} {
		require.True(t, laned(op, []byte(`{"workspace_session_id":"ws-1"}`)), op)
	}
	for _, op := range []string{"exec_command", "write_command_stdin", "read_command_lines", "cancel_command", "file_read",
		"file_write", "file_edit", "file_list", "file_search", "file_upload", "file_download", "diff_workspace_session",
		"list_workspace_sessions", "check_publish", "snapshot", "daemon", "export_layerstack", "recover_workspace_session"} {
		require.False(t, laned(op, nil), op)
	}
	require.False(t, laned("publish_workspace_session", []byte(`{"workspace_session_id":"ws-1","verify":{"cmd":"make test"}}`)),
		"a verified publish holds no CPU while its command runs")
	require.True(t, laned("publish_workspace_session", []byte(`{"workspace_session_id":"ws-1","verify":null}`)))
	require.True(t, laned("publish_workspace_session", []byte(`not json`)), "refused by the handler, inside the lane")
}

// threadNice is the nice value of the calling thread.
func threadNice(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/stat")
	require.NoError(t, err)
	return statNice(t, string(b))
}

// statNice is field 19 of a /proc/<pid>/stat line (after the comm in
// parentheses, which may hold spaces).
func statNice(t *testing.T, stat string) int {
	t.Helper()
	rest := stat[strings.LastIndexByte(stat, ')')+2:]
	f := strings.Fields(rest)
	n, err := strconv.Atoi(f[16]) // fields 3.. after the comm: 19 is index 16
	require.NoError(t, err)
	return n
}

func TestRunNicedLowersOnlyItsOwnThread(t *testing.T) {
	require.Equal(t, 0, threadNice(t), "the test starts at normal weight")
	var inside, forkedNiced, forkedUnniced, tid int
	var stdout []byte
	runNiced(10, func(err error) { t.Errorf("setpriority: %v", err) }, func() {
		tid = unix.Gettid()
		inside = threadNice(t)
		// A process forked here inherits the thread's nice value...
		out, err := exec.Command("cat", "/proc/self/stat").Output()
		require.NoError(t, err)
		forkedNiced = statNice(t, string(out))
		// ...one forked through unniced does not (a session's init).
		require.NoError(t, unniced(func() error {
			var err error
			stdout, err = exec.Command("cat", "/proc/self/stat").Output()
			return err
		}))
		forkedUnniced = statNice(t, string(stdout))
	})
	require.Equal(t, 10, inside)
	require.Equal(t, 10, forkedNiced, "the test would see a leak")
	require.Equal(t, 0, forkedUnniced)
	require.Equal(t, 0, threadNice(t), "the caller's thread is untouched")

	// The niced thread dies with its goroutine (just after it answered):
	// no thread of this process is left niced for other goroutines.
	// (On the process's main thread the runtime parks it for good instead:
	// it never runs a goroutine again.)
	for tid != os.Getpid() {
		if _, err := os.Stat(filepath.Join("/proc/self/task", strconv.Itoa(tid))); os.IsNotExist(err) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/stat")
	require.NoError(t, err)
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil || filepath.Base(filepath.Dir(f)) == strconv.Itoa(os.Getpid()) {
			continue // a thread that exited meanwhile, or the main thread (parked for good if it ever ran one)
		}
		require.Equal(t, 0, statNice(t, string(b)), "thread %s", f)
	}
}

func TestRunNicedReraisesPanics(t *testing.T) {
	require.PanicsWithValue(t, "boom", func() { runNiced(5, nil, func() { panic("boom") }) })
	require.PanicsWithValue(t, "boom", func() { _ = unniced(func() error { panic("boom") }) })
}

func TestLaneRunsOnNicedThread(t *testing.T) {
	l := newLane(1, time.Hour, 7, nil)
	res, _, err := l.run(context.Background(), func(ctx context.Context) (any, error) { return threadNice(t), nil })
	require.NoError(t, err)
	require.Equal(t, 7, res)
	l = newLane(1, time.Hour, -1, nil)
	res, _, err = l.run(context.Background(), func(ctx context.Context) (any, error) { return threadNice(t), nil })
	require.NoError(t, err)
	require.Equal(t, 0, res, "negative nice: normal weight")
}

// With the lane full (its one slot held, a publish queued behind it),
// interactive operations of the same daemon answer at once, and the
// queued publish is still queued when they have.
func TestInteractiveOpsBypassAFullLane(t *testing.T) {
	d := openTestDaemon(t, t.TempDir(), map[string]string{"f.txt": "one\n"}, func(c *Config) { c.BackgroundLanes = 1 })
	h := NewServer(d).http.Handler
	fakeSession(t, d, "ws-a", "alice", map[string]string{"a.txt": "a\n"})
	fakeSession(t, d, "ws-b", "bob", map[string]string{"b.txt": "b\n"})

	release, _, err := d.lane.acquire(context.Background()) // a slow background operation
	require.NoError(t, err)
	published := make(chan int, 1)
	go func() {
		code, _ := rpc(t, h, "rid-pub", "publish_workspace_session", map[string]any{"workspace_session_id": "ws-a"})
		published <- code
	}()
	waitQueued(d.lane, 1)

	// (The fake sessions have no mounted workspace: file operations go to
	// the head, sessionless; the diff reads ws-b's upper dir.)
	code, out := rpc(t, h, "", "file_read", map[string]any{"path": "f.txt"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = rpc(t, h, "", "file_write", map[string]any{"path": "new.txt", "content": "x\n"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = rpc(t, h, "", "file_list", map[string]any{"path": "."})
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = rpc(t, h, "", "diff_workspace_session", map[string]any{"workspace_session_id": "ws-b"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = rpc(t, h, "", "list_workspace_sessions", map[string]any{})
	require.Equal(t, http.StatusOK, code, "%v", out)

	// The daemon view shows the lane as it is: one running, one queued.
	code, out = rpc(t, h, "", "daemon", map[string]any{})
	require.Equal(t, http.StatusOK, code, "%v", out)
	ln := out["daemon"].(map[string]any)["background_lane"].(map[string]any)
	require.EqualValues(t, 1, ln["running"])
	require.EqualValues(t, 1, ln["queued"])
	require.Equal(t, map[string]any{"state": "off"}, out["daemon"].(map[string]any)["ingress_guard"],
		"a daemon not asked to guard (not its container's supervisor's child) says so")
	select {
	case c := <-published:
		t.Fatalf("the publish got past a full lane (status %d)", c)
	default:
	}
	release()
	require.Equal(t, http.StatusOK, <-published)
	require.Equal(t, 0, d.lane.stats().Running)

	// Its dispatch span says it waited in the lane.
	code, out = rpc(t, h, "", "trace", map[string]any{"trace_id": "rid-pub"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	raw, err := json.Marshal(out)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"lane":"background"`)
	require.Contains(t, string(raw), `"lane_wait_ms"`)
}

// acquireLater acquires a slot of l in a goroutine: its release arrives
// on the channel once it holds one.
func acquireLater(t *testing.T, l *lane) chan func() {
	got := make(chan func(), 1)
	go func() {
		rel, _, err := l.acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- rel
	}()
	return got
}
