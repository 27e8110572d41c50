package command

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

func TestTTY(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	tests := []struct {
		name       string
		rows, cols uint16
		want       string
	}{
		{name: "default size", want: "tty\n24 80\nerr"},
		{name: "given size", rows: 30, cols: 100, want: "tty\n30 100\nerr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := run(t, e, h, api.ExecCommandArgs{Cmd: "test -t 0 && test -t 1 && echo tty; stty size; echo err >&2",
				TTY: true, Rows: tt.rows, Cols: tt.cols})
			require.Equal(t, api.StatusOK, out.Status)
			require.Equal(t, tt.want, out.Output)
			require.Equal(t, tt.want, out.Stdout, "a terminal has one stream")
			require.Empty(t, out.Stderr)
		})
	}
}

func TestTTYResize(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	ctx := context.Background()
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "stty -echo; stty size; read x; stty size", TTY: true, YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	waitOutput(t, e, id, hasLine("24 80"))
	require.NoError(t, e.Resize(api.ResizeCommandArgs{CommandSessionID: id, Rows: 40, Cols: 120}))
	requireKind(t, e.Resize(api.ResizeCommandArgs{CommandSessionID: id}), api.KindInvalidRequest)
	out, err := e.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "\n", YieldTimeMS: ms(long)})
	require.NoError(t, err)
	require.Equal(t, api.StatusOK, out.Status)
	page, err := e.Read(context.Background(), api.ReadCommandLinesArgs{CommandSessionID: id})
	require.NoError(t, err)
	require.Equal(t, "24 80\n40 120", page.Output, "echo is off: the newline is not shown")
	requireKind(t, e.Resize(api.ResizeCommandArgs{CommandSessionID: id, Rows: 10, Cols: 10}), api.KindOperationFailed)
}

func TestTTYCtrlCIsSIGINT(t *testing.T) {
	e, h := newTestEngine(t, Options{})
	out := run(t, e, h, api.ExecCommandArgs{Cmd: "trap 'echo INT; exit 3' INT; echo ready; while :; do sleep 0.05; done",
		TTY: true, YieldTimeMS: ms(0)})
	id := out.CommandSessionID
	waitOutput(t, e, id, hasLine("ready"))
	out, err := e.WriteStdin(context.Background(), api.WriteCommandStdinArgs{CommandSessionID: id, Stdin: "\x03", YieldTimeMS: ms(long)})
	require.NoError(t, err)
	require.Equal(t, api.StatusError, out.Status, "^C reached the program, not the engine's cancel")
	require.Equal(t, 3, *out.ExitCode)
	require.Equal(t, "ready\n^CINT", out.Output, "the terminal echoes ^C")
}
