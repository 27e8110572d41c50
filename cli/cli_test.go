package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

func isolate(t *testing.T) {
	t.Setenv("SANDBOX_GATEWAY_TOKEN_FILE", filepath.Join(t.TempDir(), "none.token"))
	t.Setenv("SANDBOX_GATEWAY_AUTH_TOKEN", "")
	t.Setenv("SANDBOX_GATEWAY_SOCKET", "")
}

func run(group string, argv ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(group, argv, &out, &errb)
	return code, out.String(), errb.String()
}

// fakeGateway records the last request and answers with the request
// echoed, or an operation_failed error for file_read.
type fakeGateway struct {
	last jsonl.Request
}

func (f *fakeGateway) answer(req jsonl.Request) any {
	f.last = req
	if req.Op == "file_read" {
		return api.Envelope{Error: api.Errorf(api.KindOperationFailed, map[string]any{"path": req.Args["path"]}, "no such file")}
	}
	return map[string]any{"op": req.Op, "args": req.Args, "scope": req.Scope}
}

func (f *fakeGateway) lines(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			line, _ := jsonl.ReadLine(c, jsonl.MaxLine)
			req, e := jsonl.DecodeRequest(line)
			if e != nil {
				c.Write(jsonl.EncodeLine(api.Envelope{Error: e}))
			} else {
				c.Write(jsonl.EncodeLine(f.answer(*req)))
			}
			c.Close()
		}
	}()
	return l.Addr().String()
}

func (f *fakeGateway) http(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req jsonl.Request
		json.NewDecoder(r.Body).Decode(&req)
		req.Op = strings.TrimPrefix(r.URL.Path, "/v1/ops/")
		req.Token = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		a := f.answer(req)
		if env, ok := a.(api.Envelope); ok {
			w.WriteHeader(api.HTTPStatus(env.Error.Kind))
		}
		json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestHelpListsOps(t *testing.T) {
	isolate(t)
	for _, g := range []string{api.GroupManagement, api.GroupRuntime, api.GroupObservability} {
		for _, argv := range [][]string{{"help"}, {}, {"--help"}} {
			code, out, _ := run(g, argv...)
			if code != 0 {
				t.Errorf("%s %v: exit %d", g, argv, code)
			}
			for _, op := range api.PublicOps(g) {
				if !strings.Contains(out, op.Name) {
					t.Errorf("%s help lacks %s", g, op.Name)
				}
			}
			if strings.Contains(out, "init_base") || strings.Contains(out, "publish_prepare") {
				t.Errorf("%s help lists internal ops", g)
			}
		}
	}
	code, out, _ := run(api.GroupRuntime, "help", "file_edit")
	if code != 0 || !strings.Contains(out, "--edits") || !strings.Contains(out, "old_string") {
		t.Errorf("help file_edit: %d %s", code, out)
	}
}

func TestArgsMapping(t *testing.T) {
	isolate(t)
	f := &fakeGateway{}
	ep := f.lines(t)
	code, out, errs := run(api.GroupRuntime, "--gateway-endpoint", ep, "--gateway-auth-token", "tok", "--sandbox-id", "eos-1",
		"--request-id", "r.1", "exec_command", "--workspace-session-id", "ws1", "--timeout-ms", "5000", "--tty", "echo hi")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.Count(out, "\n") != 1 || !json.Valid([]byte(out)) {
		t.Errorf("stdout not one JSON line: %q", out)
	}
	l := f.last
	if l.Op != "exec_command" || l.Token != "tok" || l.RequestID != "r.1" || l.Scope.Kind != "sandbox" || l.Scope.SandboxID != "eos-1" {
		t.Errorf("envelope: %+v", l)
	}
	if l.Args["cmd"] != "echo hi" || l.Args["workspace_session_id"] != "ws1" || l.Args["tty"] != true {
		t.Errorf("args: %v", l.Args)
	}
	if n, ok := l.Args["timeout_ms"].(json.Number); !ok || n.String() != "5000" {
		t.Errorf("timeout_ms not an integer: %#v", l.Args["timeout_ms"])
	}
	if _, ok := l.Args["yield_time_ms"]; ok {
		t.Error("unset flag sent")
	}

	code, _, errs = run(api.GroupRuntime, "--gateway-endpoint", ep, "--sandbox-id", "eos-1", "file_edit", "--path", "a.txt",
		"--edits", `[{"old_string":"a","new_string":"b","replace_all":true}]`)
	if code != 0 {
		t.Fatalf("file_edit exit %d: %s", code, errs)
	}
	edits, _ := f.last.Args["edits"].([]any)
	if len(edits) != 1 || edits[0].(map[string]any)["replace_all"] != true {
		t.Errorf("edits: %#v", f.last.Args["edits"])
	}

	// egress: a word or a JSON array.
	for flag, want := range map[string]any{"none": "none", `["10.0.0.0/8:443"]`: []any{"10.0.0.0/8:443"}} {
		code, _, errs = run(api.GroupRuntime, "--gateway-endpoint", ep, "--sandbox-id", "eos-1", "create_workspace_session",
			"--network-profile", "isolated", "--egress", flag)
		if code != 0 {
			t.Fatalf("create_workspace_session --egress %s: exit %d: %s", flag, code, errs)
		}
		if got := f.last.Args["egress"]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("--egress %s: sent %#v", flag, got)
		}
	}

	// Management: system scope, alias flag.
	t.Setenv("SANDBOX_GATEWAY_SOCKET", ep)
	t.Setenv("SANDBOX_GATEWAY_AUTH_TOKEN", "envtok")
	code, _, errs = run(api.GroupManagement, "create_sandbox", "--image", "ubuntu:24.04", "--workspace-bind-root", "/tmp/w", "--count", "2")
	if code != 0 {
		t.Fatalf("create_sandbox exit %d: %s", code, errs)
	}
	if f.last.Scope.Kind != "system" || f.last.Args["workspace_root"] != "/tmp/w" || f.last.Token != "envtok" {
		t.Errorf("create_sandbox: %+v", f.last)
	}
	// Observability: scope from --sandbox-id.
	run(api.GroupObservability, "snapshot")
	if f.last.Scope.Kind != "system" {
		t.Errorf("snapshot scope %+v", f.last.Scope)
	}
	run(api.GroupObservability, "--sandbox-id", "eos-2", "events", "--last-n", "5")
	if f.last.Scope.SandboxID != "eos-2" || f.last.Op != "events" {
		t.Errorf("events: %+v", f.last)
	}
}

func TestTokenFileLoaded(t *testing.T) {
	isolate(t)
	p := filepath.Join(t.TempDir(), "gw.token")
	os.WriteFile(p, []byte("filetok\n"), 0o600)
	t.Setenv("SANDBOX_GATEWAY_TOKEN_FILE", p)
	f := &fakeGateway{}
	ep := f.lines(t)
	if code, _, errs := run(api.GroupManagement, "--gateway-endpoint", ep, "list_sandboxes"); code != 0 {
		t.Fatal(errs)
	}
	if f.last.Token != "filetok" {
		t.Errorf("token %q", f.last.Token)
	}
}

func TestUsageErrors(t *testing.T) {
	isolate(t)
	f := &fakeGateway{}
	ep := f.lines(t)
	cases := [][]string{
		{"exec_command", "ls"},                                           // no --sandbox-id
		{"--sandbox-id", "s", "exec_command"},                            // missing cmd
		{"--sandbox-id", "s", "exec_command", "--cmd", "a", "b"},         // both
		{"--sandbox-id", "s", "exec_command", "a", "b"},                  // two positionals
		{"--sandbox-id", "s", "exec_command", "--timeout-ms", "x", "ls"}, // not an int
		{"--sandbox-id", "s", "exec_command", "--timeout-ms", "0", "ls"}, // below min
		{"--sandbox-id", "s", "read_command_lines", "--command-session-id", "c", "--limit", "5000"},
		{"--sandbox-id", "s", "exec_command", "--cwd", "a", "--cwd", "b", "ls"}, // duplicate
		{"--sandbox-id", "s", "file_edit", "--path", "a", "--edits", "{}"},      // not an array
		{"--sandbox-id", "s", "exec_command", "--bogus", "1", "ls"},
		{"--sandbox-id", "s", "no_such_op"},
		{"--sandbox-id", "s", "init_base"},
		{"--sandbox-id", "s", "--request-id", "bad id!", "exec_command", "ls"},
	}
	for _, argv := range cases {
		f.last = jsonl.Request{}
		code, out, errs := run(api.GroupRuntime, append([]string{"--gateway-endpoint", ep}, argv...)...)
		if code != ExitUsage {
			t.Errorf("%v: exit %d, want 2 (%s)", argv, code, errs)
		}
		var env api.Envelope
		if err := json.Unmarshal([]byte(errs), &env); err != nil || env.Error == nil || env.Error.Kind != api.KindInvalidRequest {
			t.Errorf("%v: stderr %q", argv, errs)
		}
		if out != "" || f.last.Op != "" {
			t.Errorf("%v: sent or printed: %q %+v", argv, out, f.last)
		}
	}
	code, _, errs := run(api.GroupRuntime, "--gateway-endpoint", ep, "--sandbox-id", "s", "exec_command")
	if code != 2 || !strings.Contains(errs, "--cmd is required for exec_command") {
		t.Errorf("missing-required message: %s", errs)
	}
}

func TestOperationError(t *testing.T) {
	isolate(t)
	for _, mode := range []string{"lines", "http"} {
		f := &fakeGateway{}
		ep := f.lines(t)
		if mode == "http" {
			ep = f.http(t)
		}
		code, out, errs := run(api.GroupRuntime, "--gateway-endpoint", ep, "--sandbox-id", "s", "file_read", "--path", "x")
		if code != ExitError || out != "" {
			t.Errorf("%s: exit %d out %q", mode, code, out)
		}
		var env api.Envelope
		if err := json.Unmarshal([]byte(errs), &env); err != nil || env.Error.Kind != api.KindOperationFailed || env.Error.Details["path"] != "x" {
			t.Errorf("%s: stderr %q", mode, errs)
		}
		code, out, _ = run(api.GroupRuntime, "--gateway-endpoint", ep, "--sandbox-id", "s", "list_workspace_sessions")
		if code != 0 || strings.Count(out, "\n") != 1 {
			t.Errorf("%s: success exit %d out %q", mode, code, out)
		}
	}
	code, _, errs := run(api.GroupManagement, "--gateway-endpoint", "127.0.0.1:1", "list_sandboxes")
	if code != ExitError || !strings.Contains(errs, "connection_error") {
		t.Errorf("connection: %d %s", code, errs)
	}
}
