package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// shellBackend is a fake daemon shell: what is written to stdin comes back
// as output lines, "exit\n" ends it, and every call is recorded.
type shellBackend struct {
	fakeBackend
	mu     sync.Mutex
	lines  []string
	done   bool
	calls  []string
	resize [][2]int64
}

func (b *shellBackend) Runtime(ctx context.Context, op, id string, args map[string]any) (any, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, op)
	switch op {
	case "exec_command":
		if args["tty"] != true {
			return nil, api.Errorf(api.KindInvalidRequest, nil, "want tty")
		}
		b.lines = append(b.lines, fmt.Sprintf("size %vx%v", args["rows"], args["cols"]))
		return json.RawMessage(`{"status":"running","command_session_id":"cmd_1"}`), nil
	case "write_command_stdin":
		in := args["stdin"].(string)
		if in == "exit\n" {
			b.done = true
		} else {
			b.lines = append(b.lines, "echo:"+strings.TrimSuffix(in, "\n"))
		}
		return json.RawMessage(`{"status":"running"}`), nil
	case "resize_command":
		b.resize = append(b.resize, [2]int64{args["rows"].(int64), args["cols"].(int64)})
		return json.RawMessage(`{"resized":true}`), nil
	case "read_command_lines":
		start := int(args["start_offset"].(int64))
		out := api.CommandOutput{Status: api.StatusRunning, CommandSessionID: "cmd_1", StartOffset: start, TotalLines: len(b.lines), EndOffset: len(b.lines)}
		for i := start; i < len(b.lines); i++ {
			out.Lines = append(out.Lines, api.OutputLine{Offset: i, Stream: "stdout", Text: b.lines[i]})
		}
		if b.done {
			out.Status = api.StatusOK
			zero := 0
			out.ExitCode = &zero
		} else {
			// the prompt: a tentative partial line past total_lines
			out.Lines = append(out.Lines, api.OutputLine{Offset: len(b.lines), Stream: "stdout", Text: "$ "})
		}
		return out, nil
	case "cancel_command":
		return json.RawMessage(`{"status":"cancelled"}`), nil
	}
	return nil, api.Errorf(api.KindInvalidRequest, nil, "unexpected %s", op)
}

func (b *shellBackend) called(op string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.calls {
		if c == op {
			n++
		}
	}
	return n
}

type termFrame struct {
	Type     string     `json:"type"`
	Lines    []string   `json:"lines"`
	Partial  string     `json:"partial"`
	Status   string     `json:"status"`
	ExitCode *int       `json:"exit_code"`
	Error    *api.Error `json:"error"`
}

func TestConsoleTerminalProtocol(t *testing.T) {
	sb := &shellBackend{}
	s := New(sb, testToken, nil)
	addr := serve(t, s)
	ck, csrf := consoleSignedIn(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hdr := http.Header{"Cookie": {ck}}

	// Bad sizes are refused before anything runs.
	_, resp, err := websocket.Dial(ctx, "ws://"+addr+"/console/terminal?sandbox_id=eos-1&rows=0&csrf="+csrf, &websocket.DialOptions{HTTPHeader: hdr})
	require.Error(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, 0, sb.called("exec_command"))
	// So is a request that is not a WebSocket handshake (a plain GET, a
	// wrong version, a bad key, a POST): no shell is started for nobody.
	ws := map[string]string{"Connection": "keep-alive, Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	for name, change := range map[string][2]string{"plain": {"Upgrade", ""}, "version": {"Sec-WebSocket-Version", "8"},
		"key": {"Sec-WebSocket-Key", "c2hvcnQ="}, "no connection": {"Connection", "keep-alive"}, "post": {"method", "POST"}} {
		hdrs, method := map[string]string{"Cookie": ck}, "GET"
		for k, v := range ws {
			hdrs[k] = v
		}
		if change[0] == "method" {
			method = change[1]
		} else {
			hdrs[change[0]] = change[1]
		}
		resp, body := consoleReq(t, addr, method, "/console/terminal?sandbox_id=eos-1&csrf="+csrf, "", hdrs)
		require.Contains(t, []int{http.StatusUpgradeRequired, http.StatusNotFound, http.StatusMethodNotAllowed}, resp.StatusCode, "%s: %s", name, body)
		if resp.StatusCode == http.StatusUpgradeRequired {
			require.Contains(t, body, `"kind":"invalid_request"`, name)
		}
		require.Equal(t, 0, sb.called("exec_command"), name)
	}

	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/console/terminal?sandbox_id=eos-1&workspace_session_id=ws-1&rows=30&cols=100&csrf="+csrf,
		&websocket.DialOptions{HTTPHeader: hdr})
	require.NoError(t, err)
	defer c.CloseNow()
	read := func() termFrame {
		t.Helper()
		_, b, err := c.Read(ctx)
		require.NoError(t, err)
		var f termFrame
		require.NoError(t, json.Unmarshal(b, &f))
		return f
	}
	// Collect frames until want shows up in the lines, the prompt or an error.
	until := func(want string) termFrame {
		t.Helper()
		for {
			f := read()
			if strings.Contains(strings.Join(f.Lines, "\n")+"|"+f.Partial, want) || (f.Error != nil && strings.Contains(f.Error.Message, want)) || f.Type == want {
				return f
			}
		}
	}
	send := func(v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		require.NoError(t, c.Write(ctx, websocket.MessageText, b))
	}
	f := until("size 30x100")
	require.Equal(t, "output", f.Type)
	require.Equal(t, "$ ", f.Partial)

	send(map[string]any{"type": "input", "data": "ls\n"})
	until("echo:ls")
	send(map[string]any{"type": "resize", "rows": 40, "cols": 120})
	send(map[string]any{"type": "resize", "rows": 0, "cols": 120}) // refused by the catalog's range
	f = until("rows")
	require.Equal(t, "error", f.Type)
	require.Equal(t, api.KindInvalidRequest, f.Error.Kind)
	send(map[string]any{"type": "rm -rf"})
	f = until("unknown terminal frame type")
	require.Equal(t, "error", f.Type)
	require.NoError(t, c.Write(ctx, websocket.MessageText, []byte("not json")))
	f = until("terminal frames are JSON")
	require.Equal(t, api.KindBadJSON, f.Error.Kind)

	send(map[string]any{"type": "input", "data": "exit\n"})
	f = until("exit")
	require.Equal(t, api.StatusOK, f.Status)
	require.NotNil(t, f.ExitCode)
	sb.mu.Lock()
	require.Equal(t, [][2]int64{{40, 120}}, sb.resize)
	sb.mu.Unlock()
	require.Equal(t, 0, sb.called("cancel_command"), "a shell that ended is not cancelled")
}

// A browser that closes the terminal ends its shell.
func TestConsoleTerminalCloseCancels(t *testing.T) {
	sb := &shellBackend{}
	s := New(sb, testToken, nil)
	addr := serve(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/console/terminal?sandbox_id=eos-1",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + testToken}}})
	require.NoError(t, err)
	_, _, err = c.Read(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Close(websocket.StatusNormalClosure, "bye"))
	require.Eventually(t, func() bool { return sb.called("cancel_command") == 1 }, 30*time.Second, 20*time.Millisecond)
}
