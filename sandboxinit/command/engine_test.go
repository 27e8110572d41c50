package command

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// long is a yield that outlasts every test command: the yield returns when
// the command ends.
const long = 10_000

func ms(v int64) *int64 { return &v }

func newTestEngine(t testing.TB, opts Options) (*Engine, *host) {
	e := New(opts)
	h := newHost(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Shutdown(ctx, 100*time.Millisecond)
	})
	return e, h
}

// run starts cmd and waits for it to end.
func run(t testing.TB, e *Engine, h *host, args api.ExecCommandArgs) *api.CommandOutput {
	t.Helper()
	if args.YieldTimeMS == nil {
		args.YieldTimeMS = ms(long)
	}
	out, err := e.Start(context.Background(), h.start, args, Meta{})
	require.NoError(t, err)
	return out
}

func requireKind(t *testing.T, err error, kind string) *api.Error {
	t.Helper()
	var ae *api.Error
	require.True(t, errors.As(err, &ae), "want an *api.Error, got %v", err)
	require.Equal(t, kind, ae.Kind, ae.Message)
	return ae
}

// waitOutput reads the command until cond holds for the response.
func waitOutput(t *testing.T, e *Engine, id string, cond func(*api.CommandOutput) bool) *api.CommandOutput {
	t.Helper()
	var last *api.CommandOutput
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, Limit: api.MaxReadLimit})
		require.NoError(t, err)
		last = out
		assert.True(c, cond(out), "last read: %+v", out)
	}, 5*time.Second, 5*time.Millisecond)
	return last
}

func hasLine(text string) func(*api.CommandOutput) bool {
	return func(o *api.CommandOutput) bool {
		for _, l := range o.Lines {
			if l.Text == text {
				return true
			}
		}
		return false
	}
}

func terminal(o *api.CommandOutput) bool { return o.Status != api.StatusRunning }

func TestStartReportsStatusAndOutput(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	tests := []struct {
		name   string
		cmd    string
		status string
		code   int
		output string
		total  int
	}{
		{name: "ok", cmd: "echo hi", status: api.StatusOK, code: 0, output: "hi", total: 1},
		{name: "no output", cmd: "true", status: api.StatusOK, code: 0, output: "", total: 0},
		{name: "exit code", cmd: "echo x; exit 3", status: api.StatusError, code: 3, output: "x", total: 1},
		{name: "killed by signal", cmd: "kill -9 $$", status: api.StatusError, code: -9, output: "", total: 0},
		{name: "crlf", cmd: `printf 'a\r\nb\r\n'`, status: api.StatusOK, output: "a\nb", total: 2},
		{name: "trailing partial line is final", cmd: `printf 'a\nb'`, status: api.StatusOK, output: "a\nb", total: 2},
		{name: "empty lines", cmd: `printf '\n\nx\n'`, status: api.StatusOK, output: "\n\nx", total: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := run(t, e, h, api.ExecCommandArgs{Cmd: tt.cmd})
			require.Equal(t, tt.status, out.Status)
			require.NotNil(t, out.ExitCode)
			require.Equal(t, tt.code, *out.ExitCode)
			require.Equal(t, tt.output, out.Output)
			require.Equal(t, tt.output, out.Stdout)
			require.Equal(t, tt.total, out.TotalLines)
			require.Equal(t, 0, out.StartOffset)
			require.Equal(t, tt.total, out.EndOffset)
			require.Equal(t, (len(tt.output)+3)/4, out.OriginalTokenCount)
			require.NotEmpty(t, out.CommandSessionID, "every response names its command (seed key set)")
			require.False(t, out.Truncated)
			require.Positive(t, out.WallTimeSeconds)
			require.Positive(t, out.CommandTotalTimeSeconds)
		})
	}
}

func TestStartRejectsBadArgs(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	_, err := e.Start(context.Background(), h.start, api.ExecCommandArgs{Cmd: "  "}, Meta{})
	requireKind(t, err, api.KindInvalidRequest)
	_, err = e.Start(context.Background(), h.start, api.ExecCommandArgs{Cmd: "true", Env: map[string]string{"A=B": "c"}}, Meta{})
	requireKind(t, err, api.KindInvalidRequest)
}

func TestStartPassesEnvAndCwd(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	dir := t.TempDir()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: `echo "$FOO"; pwd`, Env: map[string]string{"FOO": "bar baz"}, Cwd: dir})
	require.Equal(t, "bar baz\n"+dir, out.Output)
}

func TestStartFailureLeavesNothingBehind(t *testing.T) {
	e, _ := newTestEngine(t, Options{})
	boom := errors.New("no session")
	_, err := e.Start(context.Background(), func(context.Context, Spec) (Process, error) { return nil, boom },
		api.ExecCommandArgs{Cmd: "true", WorkspaceSessionID: "ws"}, Meta{WorkspaceSessionID: "ws"})
	require.ErrorIs(t, err, boom)
	require.Empty(t, e.Active("ws"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	e.Shutdown(ctx, time.Millisecond)
	require.NoError(t, ctx.Err(), "a failed start must not keep Shutdown waiting")
}

func TestCommandIDsAreRandom(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	re := regexp.MustCompile(`^cmd_[0-9a-f]{16}$`)
	seen := map[string]bool{}
	for range 5 {
		out := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 5", YieldTimeMS: ms(0)})
		require.Regexp(t, re, out.CommandSessionID)
		require.False(t, seen[out.CommandSessionID])
		seen[out.CommandSessionID] = true
	}
}

func TestUnknownCommandIsNotFound(t *testing.T) {
	e, _ := newTestEngine(t, Options{})
	const id = "cmd_0000000000000000"
	ctx := context.Background()
	ops := map[string]func() error{
		"read": func() error {
			_, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id})
			return err
		},
		"write stdin": func() error {
			_, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "x"})
			return err
		},
		"cancel":      func() error { _, err := e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: id}); return err },
		"resize":      func() error { return e.Resize(api.ResizeCommandArgs{CommandSessionID: id, Rows: 1, Cols: 1}) },
		"close stdin": func() error { return e.CloseStdin(id) },
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			ae := requireKind(t, op(), api.KindNotFound)
			require.Equal(t, "command not found: "+id, ae.Message)
		})
	}
	e.SetResult(id, func(*api.CommandOutput) {}) // ignored
}

func TestStdoutAndStderrAreSeparate(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "echo out; echo err >&2"})
	require.Equal(t, "out", out.Stdout)
	require.Equal(t, "err", out.Stderr)
	require.ElementsMatch(t, []string{"out", "err"}, strings.Split(out.Output, "\n"))
	require.Len(t, out.Lines, 2)
	for _, l := range out.Lines {
		require.Equal(t, l.Text, l.Stream[3:], "line %q came from %s", l.Text, l.Stream)
	}
}

func TestStdinInteraction(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "read x; echo got $x", YieldTimeMS: ms(0)})
	require.Equal(t, api.StatusRunning, out.Status)
	require.Nil(t, out.ExitCode)
	out, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: out.CommandSessionID, Stdin: "hello\n", YieldTimeMS: ms(long)})
	require.NoError(t, err)
	require.Equal(t, api.StatusOK, out.Status)
	require.Equal(t, "got hello", out.Output)
}

func TestPartialLineIsShownWhileRunning(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "printf 'name? '; read x; echo got $x", YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	out = waitOutput(t, e, id, hasLine("name? "))
	require.Equal(t, 0, out.TotalLines, "a partial line is not counted")
	require.Equal(t, 0, out.EndOffset)
	require.Equal(t, []api.OutputLine{{Offset: 0, Stream: "stdout", Text: "name? "}}, out.Lines)
	require.Equal(t, "name? ", out.Output)

	out, err := e.WriteStdin(context.Background(), api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "bob\n", YieldTimeMS: ms(long)})
	require.NoError(t, err)
	require.Equal(t, api.StatusOK, out.Status)
	require.Equal(t, "name? got bob", out.Output, "the completed line comes back whole")
	require.Equal(t, 1, out.TotalLines)
}

func TestYieldsReturnEachLineOnce(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "echo a; read x; echo b; read y; echo c", YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	got := map[int]string{}
	collect := func(o *api.CommandOutput) {
		for _, l := range o.Lines {
			if l.Offset >= o.TotalLines {
				continue // tentative partial line
			}
			_, dup := got[l.Offset]
			require.False(t, dup, "line %d returned twice", l.Offset)
			got[l.Offset] = l.Text
		}
	}
	collect(out)
	poll := func(stdin string, until int) {
		require.Eventually(t, func() bool {
			o, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: stdin, YieldTimeMS: ms(20)})
			require.NoError(t, err)
			stdin = ""
			collect(o)
			return len(got) >= until
		}, 5*time.Second, time.Millisecond)
	}
	poll("", 1)
	poll("\n", 2)
	last, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "\n", YieldTimeMS: ms(long)})
	require.NoError(t, err)
	require.Equal(t, api.StatusOK, last.Status)
	collect(last)
	require.Equal(t, map[int]string{0: "a", 1: "b", 2: "c"}, got)

	// Terminal responses are idempotent.
	again, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, YieldTimeMS: ms(long)})
	require.NoError(t, err)
	again.WallTimeSeconds = last.WallTimeSeconds
	require.Equal(t, last, again)

	// Read pages explicitly and does not move the cursor.
	page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, "a\nb\nc", page.Output)
	require.Equal(t, id, page.CommandSessionID)
	again, err = e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, last.Output, again.Output)
}

func TestCancel(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	// The shell exits 0 on SIGTERM: cancelled still wins.
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done", YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	waitOutput(t, e, id, hasLine("ready"))
	out, err := e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, api.StatusCancelled, out.Status)
	require.Equal(t, api.ExitCancelled, *out.ExitCode)

	again, err := e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: id})
	require.NoError(t, err, "cancelling a finished command returns its terminal response")
	require.Equal(t, api.StatusCancelled, again.Status)
}

func TestCancelKillsWhatIgnoresSIGTERM(t *testing.T) {
	e, h := newTestEngine(t, Options{KillGrace: 50 * time.Millisecond})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "trap '' TERM; echo ready; sleep 30", YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	waitOutput(t, e, id, hasLine("ready"))
	begin := time.Now()
	out, err := e.Cancel(context.Background(), api.CancelCommandArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, api.StatusCancelled, out.Status)
	require.Equal(t, api.ExitCancelled, *out.ExitCode)
	require.Less(t, time.Since(begin), 20*time.Second, "the cancel did not wait for sleep 30")
}

func TestCtrlCWithoutTTYCancels(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	for _, ctrl := range []string{"\x03", "abc\x04"} {
		out := run(t, e, h, api.ExecCommandArgs{Cmd: "cat", YieldTimeMS: ms(0)})
		out, err := e.WriteStdin(context.Background(), api.WriteCommandStdinArgs{CommandSessionID: out.CommandSessionID, Stdin: ctrl})
		require.NoError(t, err)
		require.Equal(t, api.StatusCancelled, out.Status)
		require.Equal(t, api.ExitCancelled, *out.ExitCode)
		require.Empty(t, out.Output, "the text is not written")
	}
}

func TestTimeout(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	begin := time.Now()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "echo started; sleep 30", TimeoutMS: ms(1000)})
	require.Equal(t, api.StatusTimedOut, out.Status)
	require.Equal(t, api.ExitTimeout, *out.ExitCode)
	require.Equal(t, "started", out.Output)
	require.Less(t, time.Since(begin), 20*time.Second, "the timeout did not wait for sleep 30")
}

func TestBackgroundChildDoesNotPinCompletion(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	begin := time.Now()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 100 & echo hi"})
	require.Equal(t, api.StatusOK, out.Status)
	require.Equal(t, "hi", out.Output)
	require.Less(t, time.Since(begin), 20*time.Second, "the background sleep 100 did not pin completion")

	// A background child that writes after the command ended is not killed
	// by SIGPIPE: its output is discarded. (Its write comes long after the
	// drain deadline: a reader held back past the deadline still records
	// what the pipe holds when it runs, collectBuffered.)
	flag := filepath.Join(t.TempDir(), "alive")
	out = run(t, e, h, api.ExecCommandArgs{Cmd: "(sleep 2; echo late; echo late >&2; touch " + flag + ") & echo hi"})
	require.Equal(t, api.StatusOK, out.Status)
	require.Eventually(t, func() bool { _, err := os.Stat(flag); return err == nil }, 30*time.Second, 10*time.Millisecond)
	page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: idOf(t, e, out)})
	require.NoError(t, err)
	require.Equal(t, "hi", page.Output, "output after completion is not recorded")
}

// idOf finds the id of a finished command whose response had none (only
// for tests: the engine has a single such command at a time there).
func idOf(t *testing.T, e *Engine, out *api.CommandOutput) string {
	t.Helper()
	if out.CommandSessionID != "" {
		return out.CommandSessionID
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	require.NotEmpty(t, e.finished)
	return e.finished[len(e.finished)-1]
}

func TestWriteToFinishedCommand(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "echo done"})
	id := idOf(t, e, out)
	_, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "x"})
	ae := requireKind(t, err, api.KindOperationFailed)
	require.Equal(t, "command is not running", ae.Message)
	_, err = e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "\x03"})
	requireKind(t, err, api.KindOperationFailed)
	requireKind(t, e.CloseStdin(id), api.KindOperationFailed)

	// Empty stdin just yields: the terminal response again.
	again, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, api.StatusOK, again.Status)
	require.Equal(t, "done", again.Output)
}

func TestStdinBackpressure(t *testing.T) {
	e, h := newTestEngine(t, Options{StdinDeadline: 100 * time.Millisecond})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 30", YieldTimeMS: ms(0)})
	_, err := e.WriteStdin(context.Background(), api.WriteCommandStdinArgs{CommandSessionID: out.CommandSessionID,
		Stdin: strings.Repeat("x", api.MaxStdinBytes)})
	ae := requireKind(t, err, api.KindOperationFailed)
	require.Equal(t, "stdin_backpressure", ae.Details["reason"])
	require.Less(t, ae.Details["bytes_written"], api.MaxStdinBytes)

	_, err = e.WriteStdin(context.Background(), api.WriteCommandStdinArgs{CommandSessionID: out.CommandSessionID,
		Stdin: strings.Repeat("x", api.MaxStdinBytes+1)})
	requireKind(t, err, api.KindRequestTooLarge)
}

func TestCloseStdin(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "cat; echo eof", YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	_, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "hello\n", YieldTimeMS: ms(0)})
	require.NoError(t, err)
	require.NoError(t, e.CloseStdin(id))
	out = waitOutput(t, e, id, terminal)
	require.Equal(t, api.StatusOK, out.Status)
	require.Equal(t, "hello\neof", out.Output)
	_, err = e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "more"})
	requireKind(t, err, api.KindOperationFailed)
}

func TestRetentionEvictsOldestFinished(t *testing.T) {
	e, h := newTestEngine(t, Options{Retained: 2})
	running := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 30", YieldTimeMS: ms(0)}).CommandSessionID
	var ids []string
	for i := range 4 {
		out := run(t, e, h, api.ExecCommandArgs{Cmd: "echo " + strconv.Itoa(i)})
		ids = append(ids, idOf(t, e, out))
	}
	for i, id := range ids {
		out, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id})
		if i < 2 {
			requireKind(t, err, api.KindNotFound)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(i), out.Output)
	}
	out, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: running})
	require.NoError(t, err, "a running command is never evicted")
	require.Equal(t, api.StatusRunning, out.Status)
}

func TestOnExitAndSetResult(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	var calls atomic.Int32
	var got *api.CommandOutput
	var gotID string
	meta := Meta{WorkspaceSessionID: "ws_1", OnExit: func(id string, out *api.CommandOutput) {
		calls.Add(1)
		gotID, got = id, out
		require.Empty(t, e.Active("ws_1"), "OnExit runs after the command left Active")
		rejected := true
		e.SetResult(id, func(o *api.CommandOutput) {
			o.PublishRejected = &rejected
			o.PublishRejectClass = "source_conflict"
		})
	}}
	out, err := e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: "echo a; echo b; exit 2", YieldTimeMS: ms(long)}, meta)
	require.NoError(t, err)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, api.StatusError, got.Status)
	require.Equal(t, 2, *got.ExitCode)
	require.Equal(t, "a\nb", got.Output)
	require.Equal(t, 2, got.TotalLines)
	require.Equal(t, "ws_1", got.WorkspaceSessionID)

	// The terminal response of Start already carries what OnExit attached,
	// and so does every later response.
	require.Equal(t, "ws_1", out.WorkspaceSessionID)
	require.NotNil(t, out.PublishRejected)
	require.True(t, *out.PublishRejected)
	page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: gotID})
	require.NoError(t, err)
	require.Equal(t, "source_conflict", page.PublishRejectClass)
	c, err := e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: gotID})
	require.NoError(t, err)
	require.Equal(t, "source_conflict", c.PublishRejectClass)
	require.Equal(t, api.StatusError, c.Status, "cancel does not change a finished command")
	require.Equal(t, int32(1), calls.Load(), "OnExit runs once")
}

func TestOnExitRunsOnceForEveryEnd(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	var mu sync.Mutex
	calls := map[string]int{}
	statuses := map[string]string{}
	meta := Meta{OnExit: func(id string, out *api.CommandOutput) {
		mu.Lock()
		defer mu.Unlock()
		calls[id]++
		statuses[id] = out.Status
	}}
	ctx := context.Background()
	start := func(args api.ExecCommandArgs) string {
		out, err := e.Start(ctx, h.start, args, meta)
		require.NoError(t, err)
		return idOf(t, e, out)
	}
	ok := start(api.ExecCommandArgs{Cmd: "true", YieldTimeMS: ms(long)})
	timedOut := start(api.ExecCommandArgs{Cmd: "sleep 30", TimeoutMS: ms(50), YieldTimeMS: ms(long)})
	cancelled := start(api.ExecCommandArgs{Cmd: "sleep 30", YieldTimeMS: ms(0)})
	_, err := e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: cancelled})
	require.NoError(t, err)
	_, err = e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: cancelled})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{ok: 1, timedOut: 1, cancelled: 1}, calls)
	require.Equal(t, map[string]string{ok: api.StatusOK, timedOut: api.StatusTimedOut, cancelled: api.StatusCancelled}, statuses)
}

func TestActive(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	start := func(ws, cmd string) string {
		out, err := e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: cmd, YieldTimeMS: ms(0)}, Meta{WorkspaceSessionID: ws})
		require.NoError(t, err)
		return out.CommandSessionID
	}
	a := start("ws_a", "sleep 30")
	b := start("ws_a", "sleep 30")
	c := start("ws_b", "sleep 30")
	require.Equal(t, []string{a, b}, e.Active("ws_a"))
	require.Equal(t, []string{c}, e.Active("ws_b"))
	_, err := e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: a})
	require.NoError(t, err)
	require.Equal(t, []string{b}, e.Active("ws_a"))
	require.Empty(t, e.Active("ws_none"))
}

func TestLargeOutputPaging(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	const n = 500_000
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "seq 1 " + strconv.Itoa(n)})
	require.Equal(t, api.StatusOK, out.Status)
	require.Equal(t, n, out.TotalLines)
	// The terminal yield returns the newest lines and says the rest is paged.
	require.True(t, out.Truncated)
	require.NotEmpty(t, out.CommandSessionID)
	require.Equal(t, n, out.EndOffset)
	require.Equal(t, n-api.MaxReadLimit, out.StartOffset)
	require.Equal(t, strconv.Itoa(n), out.Lines[len(out.Lines)-1].Text)
	chars := 0
	for i := 1; i <= n; i++ {
		chars += len(strconv.Itoa(i)) + 1
	}
	require.Equal(t, (chars-1+3)/4, out.OriginalTokenCount)

	id := out.CommandSessionID
	first, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, 0, first.StartOffset)
	require.Equal(t, api.DefaultReadLimit, first.EndOffset)
	require.Equal(t, "1", first.Lines[0].Text)
	require.Equal(t, strconv.Itoa(api.DefaultReadLimit), first.Lines[api.DefaultReadLimit-1].Text)
	require.False(t, first.Truncated)

	for off := 0; off < n; off += api.MaxReadLimit * 50 { // a sample of full pages
		page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, StartOffset: off, Limit: 5000})
		require.NoError(t, err)
		require.Len(t, page.Lines, api.MaxReadLimit, "limit is clamped")
		for i, l := range page.Lines {
			require.Equal(t, off+i, l.Offset)
			require.Equal(t, strconv.Itoa(off+i+1), l.Text)
		}
	}
	last, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, StartOffset: n - 10})
	require.NoError(t, err)
	require.Equal(t, n-10, last.StartOffset)
	require.Equal(t, n, last.EndOffset)
	require.Equal(t, n, last.TotalLines)
	require.Len(t, last.Lines, 10)
	require.Equal(t, strconv.Itoa(n), last.Lines[9].Text)
	beyond, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, StartOffset: n + 5})
	require.NoError(t, err)
	require.Equal(t, n, beyond.StartOffset)
	require.Empty(t, beyond.Lines)
	_, err = e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, StartOffset: -1})
	requireKind(t, err, api.KindInvalidRequest)
}

func TestResponsesAreByteCapped(t *testing.T) {
	e, h := newTestEngine(t, Options{MaxResponseBytes: 1000})
	// 50 lines of 100 bytes: a response holds 10.
	out := run(t, e, h, api.ExecCommandArgs{Cmd: `i=0; while [ $i -lt 50 ]; do printf '%0100d\n' $i; i=$((i+1)); done`})
	require.Equal(t, 50, out.TotalLines)
	require.Equal(t, 40, out.StartOffset)
	require.True(t, out.Truncated)
	page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: out.CommandSessionID, StartOffset: 5})
	require.NoError(t, err)
	require.Equal(t, 5, page.StartOffset)
	require.Equal(t, 15, page.EndOffset, "the next page starts at end_offset")
	require.False(t, page.Truncated)
}

func TestOutputBeyondMaxBytesIsDropped(t *testing.T) {
	e, h := newTestEngine(t, Options{MaxBytes: 64 << 10})
	const n = 100_000
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "seq 1 " + strconv.Itoa(n)})
	require.Equal(t, n, out.TotalLines, "offsets keep counting")
	require.Equal(t, strconv.Itoa(n), out.Lines[len(out.Lines)-1].Text)
	page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: out.CommandSessionID, StartOffset: 0})
	require.NoError(t, err)
	require.True(t, page.Truncated)
	require.Positive(t, page.StartOffset)
	require.Equal(t, strconv.Itoa(page.StartOffset+1), page.Lines[0].Text)
}

func TestLongLinesAreSplit(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: `head -c 200000 /dev/zero | tr '\0' a; echo; echo end`})
	require.Equal(t, 5, out.TotalLines)
	var lens []int
	for _, l := range out.Lines {
		lens = append(lens, len(l.Text))
	}
	require.Equal(t, []int{65536, 65536, 65536, 200000 - 3*65536, 3}, lens)
}

func TestReadsDuringHeavyOutputAreConsistent(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "seq 1 300000", YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, StartOffset: (i * 7919 * (g + 1)) % 300000, Limit: 500})
				if !assertPage(t, page, err) || page.Status != api.StatusRunning {
					return
				}
			}
		}()
	}
	wg.Wait()
	out = waitOutput(t, e, id, terminal)
	require.Equal(t, 300000, out.TotalLines)
}

func assertPage(t *testing.T, page *api.CommandOutput, err error) bool {
	if !assertNoError(t, err) {
		return false
	}
	for i, l := range page.Lines {
		want := strconv.Itoa(l.Offset + 1)
		if l.Offset >= page.TotalLines { // tentative partial line
			if !strings.HasPrefix(want, l.Text) || i != len(page.Lines)-1 {
				t.Errorf("bad partial line %+v", l)
				return false
			}
			continue
		}
		if l.Offset != page.StartOffset+i || l.Text != want {
			t.Errorf("line %d of page at %d: %+v", i, page.StartOffset, l)
			return false
		}
	}
	return true
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func TestShutdown(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	polite := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 30", YieldTimeMS: ms(0)}).CommandSessionID
	stubborn := run(t, e, h, api.ExecCommandArgs{Cmd: "trap '' TERM; echo ready; sleep 30", YieldTimeMS: ms(0)}).CommandSessionID
	waitOutput(t, e, stubborn, hasLine("ready"))
	begin := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e.Shutdown(sctx, 200*time.Millisecond)
	require.NoError(t, sctx.Err())
	require.Less(t, time.Since(begin), 4*time.Second, "shutdown killed the stubborn command after its grace")
	for _, id := range []string{polite, stubborn} {
		out, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id})
		require.NoError(t, err)
		require.Equal(t, api.StatusCancelled, out.Status)
	}
	_, err := e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: "true"}, Meta{})
	requireKind(t, err, api.KindShuttingDown)
}

func TestResizeWithoutTTY(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 30", YieldTimeMS: ms(0)})
	requireKind(t, e.Resize(api.ResizeCommandArgs{CommandSessionID: out.CommandSessionID, Rows: 10, Cols: 10}), api.KindInvalidRequest)
}

// A streaming yield hands each line to the sink while the command runs,
// once, in order, and the response is the same as without streaming.
func TestStreamingYieldDeliversLinesAsTheyAppear(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	var mu sync.Mutex
	var got []api.OutputLine
	// The command waits for a file the sink creates when it sees "one": it
	// can only end if "one" was streamed while it ran.
	flag := filepath.Join(t.TempDir(), "seen-one")
	ctx := WithLineSink(context.Background(), func(l api.OutputLine) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, l)
		if l.Text == "one" {
			require.NoError(t, os.WriteFile(flag, nil, 0o600))
		}
	})
	out, err := e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: "echo one; echo two >&2; while [ ! -e " + flag + " ]; do sleep 0.01; done; echo three", YieldTimeMS: ms(long)}, Meta{})
	require.NoError(t, err)
	require.Equal(t, api.StatusOK, out.Status)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 3)
	streams := map[string]string{}
	for i, l := range got {
		require.Equal(t, i, l.Offset, "in order, each once")
		streams[l.Text] = l.Stream
	}
	require.Equal(t, map[string]string{"one": "stdout", "two": "stderr", "three": "stdout"}, streams)
	require.Equal(t, "three", got[2].Text)
	require.Equal(t, got[0].Text+"\n"+got[1].Text+"\nthree", out.Output, "the response is unchanged")

	// A later yield streams only the lines after its cursor.
	got = got[:0]
	mu.Unlock()
	out, err = e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: "echo a; read x; echo b", YieldTimeMS: ms(0)}, Meta{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		o, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: out.CommandSessionID})
		require.NoError(t, err)
		return o.TotalLines == 1
	}, 5*time.Second, 5*time.Millisecond)
	first, err := e.WriteStdin(context.Background(), api.WriteCommandStdinArgs{CommandSessionID: out.CommandSessionID, YieldTimeMS: ms(0)})
	require.NoError(t, err)
	require.Equal(t, "a", out.Output+first.Output, "Start's response has it when sh printed it before Start answered")
	last, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: out.CommandSessionID, Stdin: "\n", YieldTimeMS: ms(long)})
	require.NoError(t, err)
	require.Equal(t, api.StatusOK, last.Status)
	mu.Lock()
	require.Len(t, got, 1)
	require.Equal(t, "b", got[0].Text)
}

// A command printing without pause cannot hold a streaming yield past its
// yield time.
func TestStreamingYieldKeepsItsDeadline(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	var n atomic.Int64
	// A sink slower than the command, like a client reading over a network.
	ctx := WithLineSink(context.Background(), func(api.OutputLine) { n.Add(1); time.Sleep(time.Millisecond) })
	done := make(chan *api.CommandOutput, 1)
	go func() {
		out, err := e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: "yes streaming", YieldTimeMS: ms(2000), TimeoutMS: ms(60_000)}, Meta{})
		require.NoError(t, err)
		done <- out
	}()
	select {
	case out := <-done:
		require.Equal(t, api.StatusRunning, out.Status, "the yield ended, the command runs on")
		require.Greater(t, n.Load(), int64(0), "lines were streamed meanwhile")
		_, err := e.Cancel(context.Background(), api.CancelCommandArgs{CommandSessionID: out.CommandSessionID})
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("a chatty command held the streaming yield far past its 2 s")
	}
}

// TestOutputBufferedAtExitIsKept: what a command wrote before it exited is
// its output even when its reader runs only after the drain deadline (a
// loaded machine's scheduler held it back): the deadline ends the wait
// for background children, not the reading of what is already in the
// pipe. A drain grace of a nanosecond makes every run such a late reader.
func TestOutputBufferedAtExitIsKept(t *testing.T) {
	e, h := newTestEngine(t, Options{DrainGrace: time.Nanosecond})
	for i := 0; i < 20; i++ {
		out := run(t, e, h, api.ExecCommandArgs{Cmd: "seq 1 20000; echo done >&2"})
		require.Equal(t, api.StatusOK, out.Status)
		require.Equal(t, 20001, out.TotalLines, "run %d: lines written before the exit were lost", i)
	}
}
