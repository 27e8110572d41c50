package command

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

func TestMaxRunningRefusesWithResourceExhausted(t *testing.T) {
	e, h := newTestEngine(t, Options{MaxRunning: 2})
	ctx := context.Background()
	var ids []string
	for range 2 {
		out := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 30", YieldTimeMS: ms(0)})
		require.Equal(t, api.StatusRunning, out.Status)
		ids = append(ids, out.CommandSessionID)
	}
	_, err := e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: "echo no", YieldTimeMS: ms(long)}, Meta{})
	ae := requireKind(t, err, api.KindResourceExhausted)
	require.Equal(t, "max_running_commands", ae.Details["limit"])
	require.Equal(t, 2, ae.Details["max"])
	require.Equal(t, 429, api.HTTPStatus(ae.Kind))

	// An ended command frees its slot.
	_, err = e.Cancel(ctx, api.CancelCommandArgs{CommandSessionID: ids[0]})
	require.NoError(t, err)
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "echo yes"})
	require.Equal(t, "yes", out.Output)
}

func TestMaxRunningCountsFailedStarts(t *testing.T) {
	e, h := newTestEngine(t, Options{MaxRunning: 1})
	for range 3 { // a start that fails gives its slot back
		_, err := e.Start(context.Background(), h.start, api.ExecCommandArgs{Cmd: "true", Cwd: "/does/not/exist", YieldTimeMS: ms(long)}, Meta{})
		require.Error(t, err)
	}
	require.Equal(t, "ok", run(t, e, h, api.ExecCommandArgs{Cmd: "echo ok"}).Output)
}

func TestOutputBudgetDropsOldestFinishedOutput(t *testing.T) {
	// Each command prints 100 lines of 1000 bytes (about 100 KB); the budget
	// holds two of them.
	const budget = 250_000
	e, h := newTestEngine(t, Options{OutputBudget: budget})
	ctx := context.Background()
	print := "for i in $(seq 100); do printf '%01000d\\n' $i; done"
	var ids []string
	for range 4 {
		out := run(t, e, h, api.ExecCommandArgs{Cmd: print})
		require.Equal(t, api.StatusOK, out.Status)
		ids = append(ids, idOf(t, e, out))
	}
	for i, id := range ids {
		out, err := e.Read(ctx, api.ReadCommandLinesArgs{CommandSessionID: id, Limit: 10})
		require.NoError(t, err, "a command whose output was dropped is still known")
		require.Equal(t, api.StatusOK, out.Status)
		require.Equal(t, 100, out.TotalLines, "counts stay")
		if i < 2 {
			require.Empty(t, out.Lines, "command %d: the oldest output goes first", i)
			require.True(t, out.Truncated)
			require.Contains(t, out.OutputDropped, "budget of 250000 bytes")
			continue
		}
		require.Empty(t, out.OutputDropped, "command %d", i)
		require.Len(t, out.Lines, 10)
		require.Equal(t, strings.Repeat("0", 999)+"1", out.Lines[0].Text)
	}
	retained := e.total.Load()
	require.LessOrEqual(t, retained, int64(budget))
	require.Greater(t, retained, int64(2*100_000))
}

// The budget cuts a running command's output down, but never its newest
// line (as MaxBytes does not).
func TestOutputBudgetKeepsRunningCommandsNewestLine(t *testing.T) {
	e, h := newTestEngine(t, Options{OutputBudget: 1000})
	ctx := context.Background()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "printf '%02000d\\n' 1; sleep 30", YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	waitOutput(t, e, id, func(o *api.CommandOutput) bool { return len(o.Lines) == 1 && len(o.Lines[0].Text) == 2000 })
	for range 3 {
		run(t, e, h, api.ExecCommandArgs{Cmd: "printf '%02000d\\n' 2"})
	}
	got, err := e.Read(ctx, api.ReadCommandLinesArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, got.Status)
	require.Len(t, got.Lines, 1, "a running command keeps its newest line whatever the budget")
	require.Empty(t, got.OutputDropped)
}

// Output a running command keeps counts too: it pushes the oldest finished
// command's output out while it runs, not only once it ends.
func TestOutputBudgetCountsRunningOutput(t *testing.T) {
	const budget = 250_000
	e, h := newTestEngine(t, Options{OutputBudget: budget})
	ctx := context.Background()
	print := "for i in $(seq 100); do printf '%01000d\\n' $i; done"
	var ids []string
	for range 2 {
		ids = append(ids, idOf(t, e, run(t, e, h, api.ExecCommandArgs{Cmd: print})))
	}
	read := func(id string) *api.CommandOutput {
		out, err := e.Read(ctx, api.ReadCommandLinesArgs{CommandSessionID: id, Limit: 10})
		require.NoError(t, err)
		return out
	}
	require.Empty(t, read(ids[0]).OutputDropped, "two fit")
	running := run(t, e, h, api.ExecCommandArgs{Cmd: print + "; sleep 30", YieldTimeMS: ms(0)}).CommandSessionID
	waitOutput(t, e, running, func(o *api.CommandOutput) bool { return o.TotalLines == 100 })
	require.Eventually(t, func() bool { return read(ids[0]).OutputDropped != "" }, 5*time.Second, 5*time.Millisecond,
		"the oldest finished output goes while the third command still runs")
	require.Empty(t, read(ids[1]).OutputDropped)
	require.Len(t, read(ids[1]).Lines, 10)
	out := read(running)
	require.Equal(t, api.StatusRunning, out.Status)
	require.Len(t, out.Lines, 10)
	require.LessOrEqual(t, e.total.Load(), int64(budget))
}

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// The budget holds for running commands too, by the memory their output
// holds: commands that printed a lot and keep running are cut down to
// their newest output (as MaxBytes cuts one), and the heap grows by about
// the budget, not by what the commands printed. (The review's case: 20
// commands printing 50 MB of long lines each, then sleeping, held 352 MiB
// after GC with a budget of 256 MiB, and up to MaxRunning × MaxBytes could.)
func TestOutputBudgetHoldsForRunningCommands(t *testing.T) {
	const budget = 16 << 20
	const n = 8
	// Each prints twice what it may keep, as in the review.
	e, h := newTestEngine(t, Options{OutputBudget: budget, MaxBytes: 4 << 20})
	base := heapInUse()
	// 8 MB each, in lines of 10 kB, then the line "end": 64 MB in all.
	print := `yes "$(head -c 9999 /dev/zero | tr '\0' a)" | head -n 800; echo end; sleep 30`
	var ids []string
	for range n {
		ids = append(ids, run(t, e, h, api.ExecCommandArgs{Cmd: print, YieldTimeMS: ms(0)}).CommandSessionID)
	}
	for _, id := range ids {
		require.Eventually(t, func() bool {
			out, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, StartOffset: 800})
			return err == nil && out.TotalLines == 801
		}, 10*time.Second, 5*time.Millisecond)
	}
	held := heapInUse() - base
	total := e.total.Load()
	t.Logf("output counted %d MiB, heap grew %d MiB, budget %d MiB", total>>20, held>>20, budget>>20)
	require.LessOrEqual(t, total, int64(budget))
	require.LessOrEqual(t, held, int64(budget+budget/4), "what the budget counts is what the output holds")

	var sum int64
	e.mu.Lock()
	for _, c := range e.cmds {
		sum += c.keptBytes()
	}
	e.mu.Unlock()
	require.Equal(t, sum, total, "the budget counts what each command holds")

	for _, id := range ids {
		out, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id})
		require.NoError(t, err)
		require.Equal(t, api.StatusRunning, out.Status)
		require.True(t, out.Truncated, "the oldest lines went")
		end, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id, StartOffset: 790})
		require.NoError(t, err)
		require.Equal(t, "end", end.Lines[len(end.Lines)-1].Text, "the newest lines stay")
	}
}
