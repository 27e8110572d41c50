package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/gin-gonic/gin"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// The console's terminal: an interactive shell in a session (or the
// sandbox) under a PTY, over a WebSocket. It is built on the catalog's
// operations — exec_command with tty, write_command_stdin, resize_command,
// read_command_lines, cancel_command — each validated and dispatched like
// any other request.
//
// Browser to gateway (text frames, JSON): {"type":"input","data":"ls\n"},
// {"type":"resize","rows":30,"cols":100}. Gateway to browser:
// {"type":"output","lines":["..."],"partial":"$ "} (new complete lines and
// the current unterminated tail), {"type":"error","error":{...}} and at the
// end {"type":"exit","status":"...","exit_code":N}.
const (
	terminalPoll      = 100 * time.Millisecond
	terminalTimeoutMS = 4 * 60 * 60 * 1000 // a shell left open ends after 4 h
	terminalReadLimit = 64 << 10
	terminalShell     = "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"
)

type terminalMsg struct {
	Type string `json:"type"`
	Data string `json:"data,omitempty"`
	Rows int    `json:"rows,omitempty"`
	Cols int    `json:"cols,omitempty"`
}

// webSocketHandshake refuses r unless it is a WebSocket handshake that
// websocket.Accept takes (RFC 6455 4.2.1: GET, Upgrade: websocket,
// Connection: Upgrade, version 13, a 16-byte key), checked before any
// work.
func webSocketHandshake(r *http.Request) *api.Error {
	has := func(header, token string) bool {
		for _, v := range r.Header.Values(header) {
			for _, t := range strings.Split(v, ",") {
				if strings.EqualFold(strings.TrimSpace(t), token) {
					return true
				}
			}
		}
		return false
	}
	key, err := base64.StdEncoding.DecodeString(r.Header.Get("Sec-WebSocket-Key"))
	switch {
	case r.Method != http.MethodGet:
		return api.Errorf(api.KindInvalidRequest, map[string]any{"method": r.Method}, "the console terminal is a WebSocket: GET with an Upgrade: websocket handshake")
	case !has("Connection", "upgrade") || !has("Upgrade", "websocket"):
		return api.Errorf(api.KindInvalidRequest, map[string]any{"need": "websocket"}, "the console terminal is a WebSocket: the request has no Upgrade: websocket handshake")
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return api.Errorf(api.KindInvalidRequest, map[string]any{"need": "websocket", "sec_websocket_version": r.Header.Get("Sec-WebSocket-Version")}, "the console terminal speaks WebSocket version 13")
	case err != nil || len(key) != 16:
		return api.Errorf(api.KindInvalidRequest, map[string]any{"need": "websocket"}, "the WebSocket handshake has no valid Sec-WebSocket-Key")
	}
	return nil
}

func queryInt(c *gin.Context, name string, def int) (int, *api.Error) {
	v := c.Query(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		return 0, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": name}, "%s must be an integer 1..1000", name)
	}
	return n, nil
}

// consoleTerminal serves GET /console/terminal?sandbox_id=ID
// [&workspace_session_id=WS][&rows=R&cols=C] as a WebSocket.
func (s *Server) consoleTerminal(c *gin.Context) {
	// Another site's page may not open a shell: refused before anything runs
	// (the WebSocket handshake checks the origin again).
	if aerr := sameOrigin(c); aerr != nil {
		abort(c, aerr)
		return
	}
	// Nor does a request that is not a WebSocket handshake: the shell would
	// run (and its session publish) with nobody to answer.
	if aerr := webSocketHandshake(c.Request); aerr != nil {
		c.Header("Upgrade", "websocket")
		c.Header("Connection", "Upgrade")
		c.Header("Sec-WebSocket-Version", "13")
		c.AbortWithStatusJSON(http.StatusUpgradeRequired, api.Envelope{Error: aerr})
		return
	}
	sandboxID := c.Query("sandbox_id")
	rows, aerr := queryInt(c, "rows", 24)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	cols, aerr := queryInt(c, "cols", 80)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	rid := c.GetString("request_id")
	// The connection outlives the request's context once hijacked; it ends
	// when either side closes.
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.Request.Context()))
	defer cancel()
	call := func(op string, args map[string]any) (json.RawMessage, *api.Error) {
		return s.Dispatch(ctx, &jsonl.Request{Op: op, RequestID: rid, Scope: jsonl.SandboxScope(sandboxID), Args: args})
	}
	args := map[string]any{"cmd": terminalShell, "tty": true, "rows": int64(rows), "cols": int64(cols),
		"yield_time_ms": int64(0), "timeout_ms": int64(terminalTimeoutMS), "env": map[string]any{"TERM": "dumb"}}
	if ws := c.Query("workspace_session_id"); ws != "" {
		args["workspace_session_id"] = ws
	}
	raw, aerr := call("exec_command", args)
	if aerr != nil {
		abort(c, aerr) // before the upgrade: a plain HTTP refusal
		return
	}
	var started api.CommandOutput
	if err := json.Unmarshal(raw, &started); err != nil || started.CommandSessionID == "" {
		abort(c, api.Errorf(api.KindInternal, nil, "exec_command answered no command_session_id"))
		return
	}
	cmdID := started.CommandSessionID
	running := true
	defer func() {
		if running {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_, _ = s.Dispatch(cctx, &jsonl.Request{Op: "cancel_command", RequestID: rid, Scope: jsonl.SandboxScope(sandboxID),
				Args: map[string]any{"command_session_id": cmdID}})
			ccancel()
		}
	}()
	conn, err := websocket.Accept(c.Writer, c.Request, nil) // same-origin only
	if err != nil {
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(terminalReadLimit)
	send := func(v any) error {
		wctx, wcancel := context.WithTimeout(ctx, StreamWriteTimeout)
		defer wcancel()
		b, _ := json.Marshal(v)
		return conn.Write(wctx, websocket.MessageText, b)
	}
	sendErr := func(aerr *api.Error) { _ = send(map[string]any{"type": "error", "error": aerr}) }

	go func() {
		defer cancel()
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var m terminalMsg
			if typ != websocket.MessageText || json.Unmarshal(b, &m) != nil {
				sendErr(api.Errorf(api.KindBadJSON, nil, "terminal frames are JSON text: {\"type\":\"input\",\"data\":...} or {\"type\":\"resize\",\"rows\":R,\"cols\":C}"))
				continue
			}
			switch m.Type {
			case "input":
				if m.Data == "" {
					continue
				}
				if _, aerr := call("write_command_stdin", map[string]any{"command_session_id": cmdID, "stdin": m.Data, "yield_time_ms": int64(0)}); aerr != nil {
					sendErr(aerr)
				}
			case "resize":
				if _, aerr := call("resize_command", map[string]any{"command_session_id": cmdID, "rows": int64(m.Rows), "cols": int64(m.Cols)}); aerr != nil {
					sendErr(aerr)
				}
			default:
				sendErr(api.Errorf(api.KindInvalidRequest, map[string]any{"type": m.Type}, "unknown terminal frame type %q", m.Type))
			}
		}
	}()

	off, partial := 0, ""
	for ctx.Err() == nil {
		raw, aerr := call("read_command_lines", map[string]any{"command_session_id": cmdID, "start_offset": int64(off), "limit": int64(api.MaxReadLimit)})
		if aerr != nil {
			if ctx.Err() == nil {
				sendErr(aerr)
				conn.Close(websocket.StatusInternalError, "read failed")
			}
			return
		}
		var out api.CommandOutput
		if err := json.Unmarshal(raw, &out); err != nil {
			sendErr(api.Errorf(api.KindInternal, nil, "decode command output: %v", err))
			return
		}
		var lines []string
		tail := ""
		for _, l := range out.Lines {
			switch {
			case l.Offset < off:
			case l.Offset < out.TotalLines:
				lines = append(lines, l.Text)
			default:
				tail = l.Text
			}
		}
		if out.EndOffset > off {
			off = out.EndOffset
		}
		if len(lines) > 0 || tail != partial {
			partial = tail
			if err := send(map[string]any{"type": "output", "lines": lines, "partial": tail}); err != nil {
				return
			}
		}
		if out.Status != api.StatusRunning {
			running = false
			if off >= out.TotalLines {
				_ = send(map[string]any{"type": "exit", "status": out.Status, "exit_code": out.ExitCode})
				conn.Close(websocket.StatusNormalClosure, "the shell ended")
				return
			}
			continue
		}
		if len(lines) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(terminalPoll):
			}
		}
	}
}
