package command

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// A command that ended is shown terminal by no call before its OnExit
// returned: an implicit session publishes there, and every terminal
// response (exec, write_command_stdin, read_command_lines) must carry the
// outcome, whichever call sees the end first.
func TestTerminalResponsesWaitForOnExit(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	entered, release := make(chan struct{}), make(chan struct{})
	started := 0
	meta := Meta{Started: func() { started++ }, OnExit: func(id string, _ *api.CommandOutput) {
		close(entered)
		<-release
		rejected := true
		e.SetResult(id, func(o *api.CommandOutput) { o.PublishRejected, o.PublishRejectClass = &rejected, "source_conflict" })
	}}
	out, err := e.Start(ctx, h.start, api.ExecCommandArgs{Cmd: "read x; echo done", YieldTimeMS: ms(0)}, meta)
	require.NoError(t, err)
	require.Equal(t, 1, started, "Started runs once, before the yield")
	require.Equal(t, api.StatusRunning, out.Status)
	id := out.CommandSessionID

	// The command may end before this write's response is rendered; that
	// response then waits for OnExit, which waits for release below: give
	// it a deadline, so it shows the command running instead.
	write, cancelWrite := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelWrite()
	_, err = e.WriteStdin(write, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "go\n", YieldTimeMS: ms(0)})
	require.NoError(t, err)
	<-entered

	// While OnExit runs, a read that cannot wait sees the command running.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	page, err := e.Read(short, api.ReadCommandLinesArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, page.Status)
	require.Nil(t, page.ExitCode)
	require.Nil(t, page.PublishRejected)

	// Calls that can wait return once OnExit did, with what it attached.
	got := make(chan *api.CommandOutput, 2)
	go func() {
		o, err := e.Read(ctx, api.ReadCommandLinesArgs{CommandSessionID: id})
		require.NoError(t, err)
		got <- o
	}()
	go func() {
		o, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, YieldTimeMS: ms(long)})
		require.NoError(t, err)
		got <- o
	}()
	require.Never(t, func() bool { return len(got) > 0 }, 100*time.Millisecond, 5*time.Millisecond, "a terminal response before OnExit returned")
	close(release)
	for range 2 {
		o := <-got
		require.Equal(t, api.StatusOK, o.Status)
		require.Equal(t, "done", o.Output)
		require.NotNil(t, o.PublishRejected)
		require.True(t, *o.PublishRejected)
		require.Equal(t, "source_conflict", o.PublishRejectClass)
	}
}
