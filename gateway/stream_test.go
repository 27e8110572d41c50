package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// scriptBackend answers read_command_lines with scripted pages (the last
// one repeats) and create_sandbox with progress.
type scriptBackend struct {
	fakeBackend
	mu       sync.Mutex
	pages    []api.CommandOutput
	reads    []int // start offsets asked for
	errAfter int   // > 0: reads after this many fail
}

func (b *scriptBackend) Runtime(ctx context.Context, op, id string, args map[string]any) (any, error) {
	if op != "read_command_lines" {
		return b.fakeBackend.Runtime(ctx, op, id, args)
	}
	b.record("runtime", op, id, args, ctx)
	if args["command_session_id"] == "missing" {
		return nil, api.Errorf(api.KindNotFound, nil, "no such command")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n, _ := asInt(args["start_offset"])
	b.reads = append(b.reads, n)
	if b.errAfter > 0 && len(b.reads) > b.errAfter {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox eos-1 is stopped")
	}
	p := b.pages[0]
	if len(b.pages) > 1 {
		b.pages = b.pages[1:]
	}
	return p, nil
}

func asInt(v any) (int, bool) {
	switch x := v.(type) {
	case json.Number:
		n, err := x.Int64()
		return int(n), err == nil
	case int64:
		return int(x), true
	case int:
		return x, true
	}
	return 0, false
}

func (b *scriptBackend) nReads() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.reads) }

func (b *scriptBackend) LifecycleProgress(ctx context.Context, op, id string, args map[string]any, progress func(string)) (any, error) {
	if op != "create_sandbox" {
		return b.Lifecycle(ctx, op, id, args)
	}
	progress("creating sandbox eos-1")
	progress("waiting for sandbox eos-1 to be ready")
	progress("sandbox eos-1 ready")
	return map[string]any{"id": "eos-1", "state": "ready"}, nil
}

func startWith(t *testing.T, b Backend, tweak func(*Server)) string {
	t.Helper()
	s := New(b, testToken, nil)
	if tweak != nil {
		tweak(s)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); l.Close(); <-done })
	return l.Addr().String()
}

type event struct{ name, data string }

// readEvents parses an SSE body; comments are returned as event "#".
func readEvents(t *testing.T, br *bufio.Reader, max int) []event {
	t.Helper()
	var evs []event
	var cur event
	for len(evs) < max {
		line, err := br.ReadString('\n')
		if err != nil {
			return evs
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if cur.name != "" {
				evs = append(evs, cur)
			}
			cur = event{}
		case strings.HasPrefix(line, ":"):
			evs = append(evs, event{"#", strings.TrimSpace(line[1:])})
		case strings.HasPrefix(line, "event: "):
			cur.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			if cur.data != "" {
				cur.data += "\n"
			}
			cur.data += line[len("data: "):]
		}
	}
	return evs
}

func intp(n int) *int { return &n }

func TestCommandStreamSSE(t *testing.T) {
	b := &scriptBackend{pages: []api.CommandOutput{
		{Status: api.StatusRunning, StartOffset: 0, EndOffset: 2, TotalLines: 2, Lines: []api.OutputLine{
			{Offset: 0, Stream: "stdout", Text: "one"}, {Offset: 1, Stream: "stderr", Text: "two"},
			{Offset: 2, Stream: "stdout", Text: "tentative"}}},
		{Status: api.StatusRunning, StartOffset: 2, EndOffset: 2, TotalLines: 2},
		{Status: api.StatusOK, ExitCode: intp(0), StartOffset: 2, EndOffset: 3, TotalLines: 3, Lines: []api.OutputLine{
			{Offset: 2, Stream: "stdout", Text: "three"}}},
	}}
	addr := startWith(t, b, func(s *Server) { s.StreamPoll = 10 * time.Millisecond })

	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sandboxes/eos-1/commands/cmd-1/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("no token: %d", resp.StatusCode)
	}

	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("%d %s", resp.StatusCode, ct)
	}
	evs := readEvents(t, bufio.NewReader(resp.Body), 10)
	var names []string
	var texts []string
	for _, e := range evs {
		names = append(names, e.name)
		if e.name == "line" {
			var l api.OutputLine
			if err := json.Unmarshal([]byte(e.data), &l); err != nil {
				t.Fatalf("line %q: %v", e.data, err)
			}
			texts = append(texts, l.Stream+":"+l.Text)
		}
	}
	if got := strings.Join(names, ","); got != "line,line,line,exit" {
		t.Fatalf("events %s (%v)", got, evs)
	}
	if got := strings.Join(texts, ","); got != "stdout:one,stderr:two,stdout:three" {
		t.Fatalf("lines %s", got)
	}
	var exit api.CommandOutput
	if err := json.Unmarshal([]byte(evs[3].data), &exit); err != nil || exit.Status != api.StatusOK || exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Fatalf("exit %q %v", evs[3].data, err)
	}
	b.mu.Lock()
	reads := b.reads
	b.mu.Unlock()
	if len(reads) != 3 || reads[0] != 0 || reads[1] != 2 || reads[2] != 2 {
		t.Fatalf("reads %v", reads)
	}
	if c := b.last(); c.kind != "runtime" || c.sandboxID != "eos-1" || c.args["command_session_id"] != "cmd-1" {
		t.Fatalf("call %+v", c)
	}
}

func TestCommandStreamErrorsAndHeartbeat(t *testing.T) {
	b := &scriptBackend{pages: []api.CommandOutput{{Status: api.StatusRunning}}}
	addr := startWith(t, b, func(s *Server) {
		s.StreamPoll = 5 * time.Millisecond
		s.StreamHeartbeat = 20 * time.Millisecond
	})
	get := func(ctx context.Context, cmd string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/sandboxes/eos-1/commands/"+cmd+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// An error before the stream starts is a plain error response.
	resp := get(context.Background(), "missing")
	var env map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&env)
	resp.Body.Close()
	if resp.StatusCode != 404 || kindOf(env) != api.KindNotFound {
		t.Fatalf("missing: %d %v", resp.StatusCode, env)
	}

	// A command that keeps running: heartbeats arrive; disconnecting stops the polling.
	ctx, cancel := context.WithCancel(context.Background())
	resp = get(ctx, "cmd-2")
	evs := readEvents(t, bufio.NewReader(resp.Body), 1)
	if len(evs) != 1 || evs[0].name != "#" || evs[0].data != "heartbeat" {
		t.Fatalf("events %v", evs)
	}
	cancel()
	resp.Body.Close()
	// The server notices the disconnect when it notices (a loaded machine
	// may take a while): wait for 100 ms (20 polls) without a read. A
	// stream that kept polling never has one.
	deadline := time.Now().Add(10 * time.Second)
	for n := b.nReads(); ; {
		time.Sleep(100 * time.Millisecond)
		m := b.nReads()
		if m == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still polling 10 s after disconnect: %d -> %d reads in 100 ms", n, m)
		}
		n = m
	}
}

func TestCommandStreamErrorEvent(t *testing.T) {
	b := &scriptBackend{errAfter: 1, pages: []api.CommandOutput{{Status: api.StatusRunning, EndOffset: 1, TotalLines: 1,
		Lines: []api.OutputLine{{Offset: 0, Stream: "stdout", Text: "x"}}}}}
	addr := startWith(t, b, func(s *Server) { s.StreamPoll = 5 * time.Millisecond })
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sandboxes/eos-1/commands/c/stream", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	evs := readEvents(t, bufio.NewReader(resp.Body), 10)
	if len(evs) != 2 || evs[0].name != "line" || evs[1].name != "error" || !strings.Contains(evs[1].data, api.KindInvalidRequest) {
		t.Fatalf("events %v", evs)
	}
}

func TestCreateProgressJSONLines(t *testing.T) {
	dir := t.TempDir()
	for _, b := range []Backend{&scriptBackend{}, &fakeBackend{}} {
		addr := startWith(t, b, nil)
		_, isProgress := b.(ProgressBackend)
		for _, stream := range []bool{true, false} {
			line := jsonl.EncodeLine(jsonl.Request{Op: "create_sandbox", Scope: jsonl.SystemScope(), Token: testToken, StreamLogs: stream,
				Args: map[string]any{"image": "img", "workspace_root": dir}})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Write(line)
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			var lines []string
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			c.Close()
			var msgs []string
			for _, l := range lines[:len(lines)-1] {
				m, ok := client.ParseCLILog([]byte(l))
				if !ok {
					t.Fatalf("not a frame: %q", l)
				}
				msgs = append(msgs, m)
			}
			want := ""
			if stream && isProgress {
				want = "creating sandbox eos-1|waiting for sandbox eos-1 to be ready|sandbox eos-1 ready"
			}
			if got := strings.Join(msgs, "|"); got != want {
				t.Fatalf("progress=%v stream=%v: frames %q", isProgress, stream, lines)
			}
			if _, err := jsonl.ParseResponse([]byte(lines[len(lines)-1])); err != nil {
				t.Fatalf("final %q: %v", lines[len(lines)-1], err)
			}
		}
	}
	if got := string(CLILogFrame(`a "b"`)); got != "cli_log(\"a \\\"b\\\"\")\n" {
		t.Fatalf("frame %q", got)
	}
}

func TestCreateProgressSSE(t *testing.T) {
	dir := t.TempDir()
	addr := startWith(t, &scriptBackend{}, nil)
	body := `{"args":{"image":"img","workspace_root":"` + dir + `"}}`
	do := func(op, body string) []event {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ops/"+op, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
		}
		return readEvents(t, bufio.NewReader(resp.Body), 20)
	}
	evs := do("create_sandbox", body)
	if len(evs) != 4 || evs[3].name != "result" {
		t.Fatalf("events %v", evs)
	}
	for i, want := range []string{"creating sandbox eos-1", "waiting for sandbox eos-1 to be ready", "sandbox eos-1 ready"} {
		var d map[string]string
		if evs[i].name != "progress" || json.Unmarshal([]byte(evs[i].data), &d) != nil || d["line"] != want {
			t.Fatalf("event %d: %v", i, evs[i])
		}
	}
	var res map[string]any
	if json.Unmarshal([]byte(evs[3].data), &res) != nil || res["id"] != "eos-1" {
		t.Fatalf("result %q", evs[3].data)
	}
	// Errors arrive as the result event's envelope.
	evs = do("create_sandbox", `{"args":{"image":"img"}}`)
	if len(evs) != 1 || evs[0].name != "result" || !strings.Contains(evs[0].data, `"error"`) {
		t.Fatalf("error events %v", evs)
	}
}

// TestCreateProgressClient runs the Go client against the gateway over both
// transports.
func TestCreateProgressClient(t *testing.T) {
	dir := t.TempDir()
	addr := startWith(t, &scriptBackend{}, nil)
	for _, ep := range []string{addr, "http://" + addr} {
		var msgs []string
		c := client.New(ep, testToken)
		out, err := c.CallProgress(context.Background(), "create_sandbox", jsonl.SystemScope(),
			map[string]any{"image": "img", "workspace_root": dir}, "", func(m string) { msgs = append(msgs, m) })
		if err != nil || !strings.Contains(string(out), `"eos-1"`) {
			t.Fatalf("%s: %s %v", ep, out, err)
		}
		if got := strings.Join(msgs, "|"); got != "creating sandbox eos-1|waiting for sandbox eos-1 to be ready|sandbox eos-1 ready" {
			t.Fatalf("%s: progress %q", ep, got)
		}
		_, err = c.CallProgress(context.Background(), "create_sandbox", jsonl.SystemScope(), map[string]any{"image": "img"}, "", func(string) {})
		if ae, ok := err.(*api.Error); !ok || ae.Kind != api.KindInvalidRequest {
			t.Fatalf("%s: missing arg: %v", ep, err)
		}
	}
}
