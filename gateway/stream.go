package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// Streaming defaults.
const (
	DefaultStreamPoll      = 250 * time.Millisecond
	DefaultStreamHeartbeat = 15 * time.Second
)

// ProgressBackend is an optional Backend extension: a Backend implementing
// it reports progress of create_sandbox (and any other lifecycle op it
// chooses) through progress. progress is safe for concurrent use and never
// nil; it must not be called after LifecycleProgress returns.
type ProgressBackend interface {
	LifecycleProgress(ctx context.Context, op, sandboxID string, args map[string]any, progress func(msg string)) (any, error)
}

// RuntimeProgressBackend is an optional Backend extension for runtime ops
// that stream: exec_command and write_command_stdin report each output line
// to progress while they wait for the command.
type RuntimeProgressBackend interface {
	RuntimeProgress(ctx context.Context, op, sandboxID string, args map[string]any, progress func(msg string)) (any, error)
}

// CLILogFrame renders one JSON-lines progress frame: cli_log("<json string>").
func CLILogFrame(msg string) []byte {
	b, _ := json.Marshal(msg)
	return []byte("cli_log(" + string(b) + ")\n")
}

// sse writes Server-Sent Events to a gin response; writes are serialized
// and dropped once closed.
type sse struct {
	mu     sync.Mutex
	w      gin.ResponseWriter
	closed bool
}

func startSSE(c *gin.Context) *sse {
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	c.Status(http.StatusOK)
	c.Writer.WriteHeaderNow()
	c.Writer.Flush()
	return &sse{w: c.Writer}
}

func (s *sse) event(name string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	var b strings.Builder
	b.WriteString("event: " + name + "\n")
	for _, l := range strings.Split(string(data), "\n") {
		b.WriteString("data: " + l + "\n")
	}
	b.WriteString("\n")
	s.write(b.String())
}

// write sends one frame; each write has StreamWriteTimeout
// (writeDeadlines), and a frame the client did not take closes the stream.
func (s *sse) write(frame string) {
	if _, err := s.w.WriteString(frame); err != nil {
		s.closed = true
		return
	}
	s.w.Flush()
}

func (s *sse) comment(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.write(": " + text + "\n\n")
}

func (s *sse) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

func (s *Server) heartbeat() time.Duration {
	if s.StreamHeartbeat > 0 {
		return s.StreamHeartbeat
	}
	return DefaultStreamHeartbeat
}

func (s *Server) poll() time.Duration {
	if s.StreamPoll > 0 {
		return s.StreamPoll
	}
	return DefaultStreamPoll
}

// heartbeats writes a comment every heartbeat interval until stop is closed.
func (s *Server) heartbeats(ev *sse, stop <-chan struct{}) {
	t := time.NewTicker(s.heartbeat())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ev.comment("heartbeat")
		}
	}
}

// streamCommand serves GET /v1/sandboxes/:id/commands/:command_id/stream:
// the command's output lines as `event: line` (data {offset, stream, text})
// and, once it is no longer running, `event: exit` with the final
// CommandOutput. A failure after the stream began is `event: error` with the
// error envelope.
func (s *Server) streamCommand(c *gin.Context) {
	sandboxID, cmdID := c.Param("id"), c.Param("command_id")
	rid := c.GetString("request_id")
	ctx := context.WithValue(c.Request.Context(), ctxKey{}, rid)
	off := 0
	polls := 0
	fetch := func() (*api.CommandOutput, json.RawMessage, *api.Error) {
		args := map[string]any{"command_session_id": cmdID, "start_offset": json.Number(fmt.Sprint(off)), "limit": json.Number(fmt.Sprint(api.MaxReadLimit))}
		polls++
		raw, aerr := s.poll1(ctx, rid, sandboxID, "read_command_lines", args, polls == 1)
		if aerr != nil {
			return nil, nil, aerr
		}
		var out api.CommandOutput
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, nil, api.Errorf(api.KindInternal, nil, "decode command output: %v", err)
		}
		return &out, raw, nil
	}
	out, raw, aerr := fetch()
	if aerr != nil {
		abort(c, aerr)
		return
	}
	ev := startSSE(c)
	defer ev.close()
	stop := make(chan struct{})
	defer close(stop)
	go s.heartbeats(ev, stop)
	for {
		final := 0
		for _, l := range out.Lines {
			// Lines past total_lines are tentative (unterminated tails of a
			// running command); they are sent once they are final.
			if l.Offset < off || l.Offset >= out.TotalLines || l.Offset >= out.EndOffset {
				continue
			}
			b, _ := json.Marshal(l)
			ev.event("line", b)
			final++
		}
		if out.EndOffset > off {
			off = out.EndOffset
		}
		if out.Status != api.StatusRunning && off >= out.TotalLines {
			ev.event("exit", raw)
			return
		}
		if final == 0 || off >= out.TotalLines {
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.poll()):
			}
		}
		if ctx.Err() != nil {
			return
		}
		out, raw, aerr = fetch()
		if aerr != nil {
			if ctx.Err() == nil {
				b, _ := json.Marshal(api.Envelope{Error: aerr})
				ev.event("error", b)
			}
			return
		}
	}
}

// wantsSSE reports whether the client asked for an event stream.
func wantsSSE(c *gin.Context) bool {
	return strings.Contains(c.GetHeader("Accept"), "text/event-stream")
}

// dispatchSSE runs req and streams `event: progress` frames (data
// {"line": msg}) and then exactly one `event: result` (data: the result or
// the error envelope).
func (s *Server) dispatchSSE(c *gin.Context, req *jsonl.Request) {
	ev := startSSE(c)
	defer ev.close()
	stop := make(chan struct{})
	defer close(stop)
	go s.heartbeats(ev, stop)
	progress := func(msg string) {
		b, _ := json.Marshal(map[string]string{"line": msg})
		ev.event("progress", b)
	}
	out, aerr := s.DispatchProgress(c.Request.Context(), req, progress)
	if aerr != nil {
		out, _ = json.Marshal(api.Envelope{Error: aerr})
	}
	ev.event("result", out)
}

// lockedProgress serializes progress calls and drops those after done.
type lockedProgress struct {
	mu   sync.Mutex
	fn   func(string)
	done bool
}

func (p *lockedProgress) call(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.fn(msg)
	}
}

func (p *lockedProgress) finish() {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
}

// streamEvents serves GET /v1/sandboxes/:id/events/stream: the sandbox
// daemon's events as `event: event` frames (data {ts, name, attrs}), first
// the last `last_n` (default 50, query parameter), then each new one as it
// happens, polling the daemon's events op with since_ms.
func (s *Server) streamEvents(c *gin.Context) {
	sandboxID := c.Param("id")
	rid := c.GetString("request_id")
	ctx := context.WithValue(c.Request.Context(), ctxKey{}, rid)
	lastN := 50
	if v := c.Query("last_n"); v != "" {
		if _, err := fmt.Sscan(v, &lastN); err != nil || lastN < 1 || lastN > 10000 {
			abort(c, api.Errorf(api.KindInvalidRequest, nil, "last_n must be 1..10000"))
			return
		}
	}
	type event struct {
		TS    time.Time      `json:"ts"`
		Name  string         `json:"name"`
		Attrs map[string]any `json:"attrs"`
	}
	fetch := func(args map[string]any, first bool) ([]json.RawMessage, []event, *api.Error) {
		raw, aerr := s.poll1(ctx, rid, sandboxID, "events", args, first)
		if aerr != nil {
			return nil, nil, aerr
		}
		var out struct {
			Events []json.RawMessage `json:"events"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, nil, api.Errorf(api.KindInternal, nil, "decode events: %v", err)
		}
		parsed := make([]event, len(out.Events))
		for i, e := range out.Events {
			_ = json.Unmarshal(e, &parsed[i])
		}
		return out.Events, parsed, nil
	}
	raws, evs, aerr := fetch(map[string]any{"last_n": json.Number(fmt.Sprint(lastN))}, true)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	ev := startSSE(c)
	defer ev.close()
	stop := make(chan struct{})
	defer close(stop)
	go s.heartbeats(ev, stop)
	// The daemon answers newest first with since_ms exclusive: emit each
	// batch oldest first, and ask again from the newest millisecond sent
	// minus one, skipping what was already sent in that millisecond, so an
	// event appended in the same millisecond as the last one is not lost.
	var since int64
	sent := map[string]bool{}
	for {
		for i := len(raws) - 1; i >= 0; i-- {
			ms := evs[i].TS.UnixMilli()
			if ms < since || (ms == since && sent[string(raws[i])]) {
				continue
			}
			if ms > since {
				since, sent = ms, map[string]bool{}
			}
			sent[string(raws[i])] = true
			ev.event("event", raws[i])
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.poll()):
		}
		if raws, evs, aerr = fetch(map[string]any{"since_ms": json.Number(fmt.Sprint(max(since-1, 0)))}, false); aerr != nil {
			if ctx.Err() == nil {
				b, _ := json.Marshal(api.Envelope{Error: aerr})
				ev.event("error", b)
			}
			return
		}
	}
}

// poll1 runs one read of a stream: the first is validated and logged like
// any request (Dispatch); later polls go straight to the backend, so a
// stream does not write a log line per poll.
func (s *Server) poll1(ctx context.Context, rid, sandboxID, op string, args map[string]any, first bool) (json.RawMessage, *api.Error) {
	if first {
		return s.Dispatch(ctx, &jsonl.Request{Op: op, RequestID: rid, Scope: jsonl.SandboxScope(sandboxID), Args: args})
	}
	v, err := s.Backend.Runtime(ctx, op, sandboxID, args)
	if err != nil {
		return nil, api.AsError(err)
	}
	if raw, ok := v.(json.RawMessage); ok {
		return raw, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, api.Errorf(api.KindInternal, nil, "encode result: %v", err)
	}
	return raw, nil
}
