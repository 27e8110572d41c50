package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
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

const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

type call struct {
	kind, op, sandboxID string
	args                map[string]any
	requestID           string
}

type fakeBackend struct {
	mu    sync.Mutex
	calls []call
}

func (f *fakeBackend) record(kind, op, id string, args map[string]any, ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{kind, op, id, args, RequestID(ctx)})
}

func (f *fakeBackend) n() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.calls) }
func (f *fakeBackend) last() call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[len(f.calls)-1]
}

func (f *fakeBackend) Lifecycle(ctx context.Context, op, id string, args map[string]any) (any, error) {
	f.record("lifecycle", op, id, args, ctx)
	if op == "destroy_sandbox" && id == "missing" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox not found: %s", id)
	}
	return map[string]any{"op": op, "sandbox_id": id, "via": "lifecycle"}, nil
}

func (f *fakeBackend) Runtime(ctx context.Context, op, id string, args map[string]any) (any, error) {
	f.record("runtime", op, id, args, ctx)
	if op == "file_read" {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"path": args["path"]}, "no such file")
	}
	return json.RawMessage(`{"status":"ok","op":"` + op + `"}`), nil
}

func start(t *testing.T) (*fakeBackend, *Server, string) {
	t.Helper()
	fb := &fakeBackend{}
	s := New(fb, testToken, nil)
	return fb, s, serve(t, s)
}

func post(t *testing.T, addr, op, auth string, body []byte) (int, map[string]any, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ops/"+op, bytes.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: body %q", op, raw)
	}
	return resp.StatusCode, out, resp.Header
}

func kindOf(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	k, _ := e["kind"].(string)
	return k
}

func rawLine(t *testing.T, addr string, line []byte) map[string]any {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(line)
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := jsonl.ReadLine(c, jsonl.MaxLine)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(resp, &out); err != nil {
		t.Fatalf("%q", resp)
	}
	return out
}

func TestAuth(t *testing.T) {
	fb, _, addr := start(t)
	body := []byte(`{"args":{}}`)
	for _, auth := range []string{"", "Bearer ", "Bearer wrong", "Bearer " + strings.Repeat("x", 100000), "Basic " + testToken, testToken} {
		code, out, _ := post(t, addr, "list_sandboxes", auth, body)
		if code != 401 || kindOf(out) != api.KindUnauthorized {
			t.Errorf("auth %.20q: %d %v", auth, code, out)
		}
	}
	for _, tok := range []string{"", "wrong", strings.Repeat("y", 100000), testToken + "x"} {
		line := jsonl.EncodeLine(jsonl.Request{Op: "list_sandboxes", Scope: jsonl.SystemScope(), Args: map[string]any{}, Token: tok})
		if out := rawLine(t, addr, line); kindOf(out) != api.KindUnauthorized {
			t.Errorf("jsonl token %.20q: %v", tok, out)
		}
	}
	if fb.n() != 0 {
		t.Fatalf("backend called %d times", fb.n())
	}
	code, out, hdr := post(t, addr, "list_sandboxes", "Bearer "+testToken, body)
	if code != 200 || out["via"] != "lifecycle" || hdr.Get("X-Request-Id") == "" {
		t.Errorf("authorized: %d %v", code, out)
	}
}

// A scope that names no kind has the one its sandbox_id implies, through
// both doors: a sandbox op given a sandbox_id runs in that sandbox, one
// given none is refused as before, a system op keeps its system scope, and
// a hostile sandbox_id is refused before the backend.
func TestScopeKindFollowsTheSandboxID(t *testing.T) {
	fb, _, addr := start(t)
	auth := "Bearer " + testToken
	for _, c := range []struct {
		op, body string
		status   int
		kind     string
	}{
		{"file_read", `{"scope":{"sandbox_id":"s"},"args":{"path":"x"}}`, 404, api.KindNotFound},
		{"exec_command", `{"args":{"cmd":"ls"}}`, 400, api.KindInvalidRequest},
		{"exec_command", `{"scope":{"sandbox_id":"../etc"},"args":{"cmd":"ls"}}`, 400, api.KindInvalidRequest},
		{"destroy_sandbox", `{"scope":{"sandbox_id":"s"},"args":{"sandbox_id":"missing"}}`, 400, api.KindInvalidRequest},
	} {
		code, out, _ := post(t, addr, c.op, auth, []byte(c.body))
		if code != c.status || kindOf(out) != c.kind {
			t.Errorf("%s %s: %d %v", c.op, c.body, code, out)
		}
	}
	line := jsonl.EncodeLine(jsonl.Request{Op: "file_read", Scope: jsonl.Scope{SandboxID: "s"}, Args: map[string]any{"path": "x"}, Token: testToken})
	if out := rawLine(t, addr, line); kindOf(out) != api.KindNotFound {
		t.Errorf("jsonl file_read with a sandbox_id and no kind: %v", out)
	}
	if n := fb.n(); n != 3 { // the two file_reads and destroy_sandbox
		t.Errorf("backend called %d times", n)
	}
}

func TestErrors(t *testing.T) {
	fb, _, addr := start(t)
	auth := "Bearer " + testToken
	cases := []struct {
		op, body string
		status   int
		kind     string
	}{
		{"no_such_op", `{}`, 400, api.KindUnknownOp},
		{"init_base", `{"scope":{"kind":"sandbox","sandbox_id":"s"}}`, 400, api.KindInvalidRequest},
		{"publish_prepare", `{"scope":{"kind":"sandbox","sandbox_id":"s"}}`, 400, api.KindInvalidRequest},
		{"exec_command", `{"scope":{"kind":"system"},"args":{"cmd":"ls"}}`, 400, api.KindInvalidRequest},
		{"exec_command", `{"scope":{"kind":"sandbox","sandbox_id":"s"},"args":{}}`, 400, api.KindInvalidRequest},
		{"exec_command", `{"scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"cmd":"ls","bogus":1}}`, 400, api.KindInvalidRequest},
		{"exec_command", `{"scope":`, 400, api.KindBadJSON},
		{"file_read", `{"scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"path":"x"}}`, 404, api.KindNotFound},
		{"destroy_sandbox", `{"args":{"sandbox_id":"missing"}}`, 400, api.KindInvalidRequest},
	}
	for _, c := range cases {
		code, out, _ := post(t, addr, c.op, auth, []byte(c.body))
		if code != c.status || kindOf(out) != c.kind {
			t.Errorf("%s %s: %d %v", c.op, c.body, code, out)
		}
	}
	for _, op := range []string{"no_such_op", "init_base", "squash_layerstack", "export_layerstack"} {
		line := jsonl.EncodeLine(jsonl.Request{Op: op, Scope: jsonl.SandboxScope("s"), Args: map[string]any{}, Token: testToken})
		out := rawLine(t, addr, line)
		if k := kindOf(out); k != api.KindUnknownOp && k != api.KindInvalidRequest {
			t.Errorf("jsonl %s: %v", op, out)
		}
	}
	if n := fb.n(); n != 2 { // file_read and destroy_sandbox only
		t.Errorf("backend called %d times", n)
	}
	// Body too large.
	big := []byte(`{"args":{"cmd":"` + strings.Repeat("a", MaxBodyBytes) + `"}}`)
	code, out, _ := post(t, addr, "exec_command", auth, big)
	if code != 413 || kindOf(out) != api.KindRequestTooLarge {
		t.Errorf("too large: %d %v", code, out)
	}
	out = rawLine(t, addr, append(big, '\n'))
	if kindOf(out) != api.KindRequestTooLarge {
		t.Errorf("jsonl too large: %v", out)
	}
	// Routes.
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz %v %v", resp, err)
	}
	resp, _ = http.Get("http://" + addr + "/v1/openapi.json")
	var doc map[string]any
	if json.NewDecoder(resp.Body).Decode(&doc) != nil || doc["openapi"] != "3.1.0" {
		t.Errorf("openapi: %v", doc["openapi"])
	}
	resp, _ = http.Get("http://" + addr + "/v1/ops/exec_command")
	if resp.StatusCode != 405 {
		t.Errorf("GET op: %d", resp.StatusCode)
	}
	resp, _ = http.Get("http://" + addr + "/nope")
	if resp.StatusCode != 404 {
		t.Errorf("no route: %d", resp.StatusCode)
	}
}

func TestSameAnswerBothTransports(t *testing.T) {
	fb, _, addr := start(t)
	lines := client.New(addr, testToken)
	httpc := client.New("http://"+addr, testToken)
	type tc struct {
		op    string
		scope jsonl.Scope
		args  map[string]any
		kind  string
		route string
	}
	for _, c := range []tc{
		{"exec_command", jsonl.SandboxScope("eos-1"), map[string]any{"cmd": "ls", "timeout_ms": 5000}, "", "runtime"},
		{"file_write", jsonl.SandboxScope("eos-1"), map[string]any{"path": "a", "content": "x"}, "", "lifecycle"},
		{"file_write", jsonl.SandboxScope("eos-1"), map[string]any{"path": "a", "content": "x", "workspace_session_id": "ws"}, "", "runtime"},
		{"create_sandbox", jsonl.SystemScope(), map[string]any{"image": "i", "workspace_root": "/w"}, "", "lifecycle"},
		{"destroy_sandbox", jsonl.SystemScope(), map[string]any{"sandbox_id": "missing"}, api.KindInvalidRequest, "lifecycle"},
		{"file_read", jsonl.SandboxScope("eos-1"), map[string]any{"path": "x"}, api.KindNotFound, "runtime"},
		{"read_command_lines", jsonl.SandboxScope("eos-1"), map[string]any{"command_session_id": "c", "limit": 5000}, api.KindInvalidRequest, ""},
		{"nope", jsonl.SystemScope(), nil, api.KindUnknownOp, ""},
	} {
		var answers []string
		for _, cl := range []*client.Client{lines, httpc} {
			before := fb.n()
			out, err := cl.Call(context.Background(), c.op, c.scope, c.args, "rid-"+c.op)
			var got string
			if err != nil {
				e := api.AsError(err)
				if e.Kind != c.kind {
					t.Errorf("%s via %s: %v", c.op, cl.Endpoint, err)
				}
				b, _ := json.Marshal(e)
				got = string(b)
			} else {
				var v any
				json.Unmarshal(out, &v)
				b, _ := json.Marshal(v)
				got = string(b)
				if c.kind != "" {
					t.Errorf("%s: want %s, got %s", c.op, c.kind, got)
				}
			}
			answers = append(answers, got)
			if c.route != "" {
				if fb.n() != before+1 {
					t.Fatalf("%s: backend not called", c.op)
				}
				l := fb.last()
				if l.kind != c.route || l.requestID != "rid-"+c.op {
					t.Errorf("%s via %s: routed %+v", c.op, cl.Endpoint, l)
				}
				if c.scope.Kind == "sandbox" && l.sandboxID != "eos-1" {
					t.Errorf("%s: sandbox id %q", c.op, l.sandboxID)
				}
			}
		}
		if answers[0] != answers[1] {
			t.Errorf("%s: JSON lines %s vs HTTP %s", c.op, answers[0], answers[1])
		}
	}
}

func TestUnixSocket(t *testing.T) {
	fb := &fakeBackend{}
	s := New(fb, testToken, nil)
	sock := t.TempDir() + "/gw.sock"
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Serve(ctx, l) }()
	out, err := client.New("unix://"+sock, testToken).Call(ctx, "list_workspace_sessions", jsonl.SandboxScope("eos-9"), nil, "")
	if err != nil || !strings.Contains(string(out), `"op":"list_workspace_sessions"`) {
		t.Fatalf("%s %v", out, err)
	}
	if l := fb.last(); l.kind != "runtime" || l.sandboxID != "eos-9" {
		t.Errorf("%+v", l)
	}
}

// Every answer of an authenticated op call says the gateway's time in its
// Server-Timing header: results, the backend's refusals and the gateway's
// own (a body that is not JSON); no daemon entries without a daemon call.
func TestOpAnswersCarryServerTiming(t *testing.T) {
	_, _, addr := start(t)
	scope := []byte(`{"scope":{"kind":"sandbox","sandbox_id":"sb-1"},"args":{"path":"x"}}`)
	for _, c := range []struct {
		op   string
		body []byte
		code int
	}{
		{"exec_command", []byte(`{"scope":{"kind":"sandbox","sandbox_id":"sb-1"},"args":{"cmd":"true"}}`), http.StatusOK},
		{"file_read", scope, http.StatusNotFound},
		{"file_read", []byte(`{not json`), http.StatusBadRequest},
	} {
		code, out, h := post(t, addr, c.op, "Bearer "+testToken, c.body)
		if code != c.code {
			t.Fatalf("%s: %d %v", c.op, code, out)
		}
		st := api.ParseServerTiming(h.Get(api.ServerTimingHeader))
		if _, ok := st.Get(api.TimingGateway); !ok || len(st) != 1 {
			t.Fatalf("%s (%d): Server-Timing %q", c.op, code, h.Get(api.ServerTimingHeader))
		}
	}
}
