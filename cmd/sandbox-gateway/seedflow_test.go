package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// Seed-contract §0.3 "Phase 0" key sets (seed-contract.md). Results may
// carry more keys; a missing key is a failure unless it is listed in
// knownShapeGaps.
var (
	keysSandboxRecord  = []string{"id", "workspace_root", "state", "daemon", "daemon_http", "shared_base", "activity_revision"}
	keysEndpoint       = []string{"host", "port"}
	keysCommandOutput  = []string{"status", "exit_code", "wall_time_seconds", "command_total_time_seconds", "start_offset", "end_offset", "total_lines", "original_token_count", "output", "command_session_id", "workspace_session_id"}
	keysFileRead       = []string{"path", "content", "start_line", "num_lines", "total_lines", "bytes_read", "total_bytes", "next_offset", "truncated"}
	keysFileWrite      = []string{"type", "path", "bytes_written"}
	keysFileEdit       = []string{"type", "path", "edits_applied", "replacements", "bytes_written"}
	keysBlame          = []string{"path", "ranges"}
	keysBlameRange     = []string{"start_line", "line_count", "owner"}
	keysCreateSession  = []string{"workspace_session_id", "network_profile", "finalize_policy"}
	keysDestroySession = []string{"workspace_session_id", "destroyed", "evicted_upperdir_bytes"}
	keysPublish        = []string{"workspace_session_id", "publish", "destroyed", "evicted_upperdir_bytes"}
	keysPublishInner   = []string{"no_op", "revision", "route_summary"}
	keysRevision       = []string{"manifest_version", "root_hash", "layer_count"}
	keysRouteSummary   = []string{"source_count", "ignored_count"}
	keysPublishFailure = []string{"workspace_session_id", "stage", "session_retained", "publish_rejection"}
	keysRejection      = []string{"path", "reason", "source_conflict", "protected_drop", "message"}
	keysExportDir      = []string{"manifest_version", "format", "layers_exported", "files_written", "symlinks_written", "deletes_applied", "opaque_clears", "skipped_unchanged", "bytes_written"}
	keysErrorEnvelope  = []string{"kind", "message", "details"}
)

// knownShapeGaps lists "<shape>.<key>" pairs of seed-contract keys our
// implementation does not (yet) return. Each entry is a reported gap, not a
// relaxation of the contract; keep it empty when there are none.
var knownShapeGaps = map[string]bool{}

func requireKeys(t *testing.T, shape string, m map[string]any, keys []string) {
	t.Helper()
	var missing []string
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			if knownShapeGaps[shape+"."+k] {
				t.Logf("known shape gap: %s lacks %q", shape, k)
				continue
			}
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s: missing seed-contract keys %v in %s", shape, missing, mustJSON(m))
	}
}

func sub(t *testing.T, m map[string]any, key string) map[string]any {
	t.Helper()
	v, ok := m[key].(map[string]any)
	if !ok {
		t.Fatalf("%q is not an object in %s", key, mustJSON(m))
	}
	return v
}

// --- the gateway as a separate process (internal/testenv) ---

// TestMain removes the binaries testenv.Binaries built.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.CleanupBinaries()
	os.Exit(code)
}

type gatewayProc = testenv.Gateway

func startGatewayProcess(t testing.TB) *gatewayProc { return testenv.StartGateway(t) }

type cliResult struct {
	code   int
	out    map[string]any // the stdout JSON line (exit 0)
	errEnv map[string]any // the stderr envelope's "error" object (exit 1/2)
	stdout string
	stderr string
}

// cli execs a CLI binary against the gateway and parses its one JSON line.
func runCLI(t *testing.T, g *gatewayProc, bin string, argv ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(g.Bins, bin), append([]string{"--gateway-endpoint", g.Addr, "--gateway-auth-token", g.Token, "--json"}, argv...)...)
	cmd.Env = append(os.Environ(), "HOME="+g.Home, "SANDBOX_GATEWAY_AUTH_TOKEN=", "SANDBOX_GATEWAY_SOCKET=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", bin, argv, err)
	}
	if r.code == 0 {
		lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
		if len(lines) != 1 {
			t.Fatalf("%s %v: want one stdout line, got %q", bin, argv, r.stdout)
		}
		if err := json.Unmarshal([]byte(lines[0]), &r.out); err != nil {
			t.Fatalf("%s %v: stdout not JSON: %q", bin, argv, r.stdout)
		}
		return r
	}
	var env map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stderr)), &env); err != nil {
		t.Fatalf("%s %v: exit %d, stderr not one JSON envelope: %q", bin, argv, r.code, r.stderr)
	}
	e, ok := env["error"].(map[string]any)
	if !ok {
		t.Fatalf("%s %v: exit %d, stderr has no error object: %q", bin, argv, r.code, r.stderr)
	}
	requireKeys(t, "error", e, keysErrorEnvelope)
	r.errEnv = e
	return r
}

func mustCLI(t *testing.T, g *gatewayProc, bin string, argv ...string) map[string]any {
	t.Helper()
	r := runCLI(t, g, bin, argv...)
	if r.code != 0 {
		t.Fatalf("%s %v: exit %d: %s", bin, argv, r.code, r.stderr)
	}
	return r.out
}

func dockerList(t testing.TB, kind, id string) []string { return testenv.DockerObjects(t, kind, id) }

func removeSandboxObjects(t testing.TB, id string) { testenv.RemoveSandboxObjects(t, id) }

// cleanupSandbox removes sandbox id's Docker objects when the test ends: the
// id as it is now (a closure over a variable the test reuses would remove
// only the last sandbox it named).
func cleanupSandbox(t testing.TB, id string) { t.Cleanup(func() { removeSandboxObjects(t, id) }) }

// gatewayWithSandbox starts a gateway and creates one sandbox over a new
// workspace that holds f.txt (content); the sandbox's objects are removed
// when the test ends. It returns the gateway, the sandbox id and the
// workspace.
func gatewayWithSandbox(t *testing.T, content string) (*gatewayProc, string, string) {
	t.Helper()
	g := startGatewayProcess(t)
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "f.txt"), content)
	rec := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", ws)
	id := rec["id"].(string)
	cleanupSandbox(t, id)
	return g, id, ws
}

const (
	mgr = "sandbox-manager-cli"
	rt  = "sandbox-runtime-cli"
)

// TestSeedFlowCLI drives the seed's whole flow through the CLI binaries
// against a separately started sandbox-gateway process, then compares raw
// JSON lines with HTTP answers.
func TestSeedFlowCLI(t *testing.T) {
	g := startGatewayProcess(t)

	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "f.txt"), "base\n")
	writeFile(t, filepath.Join(ws, "shared.txt"), "alpha\nbravo\ncharlie\ndelta\necho\n")

	// Usage error: nothing sent, exit 2, envelope on stderr.
	if r := runCLI(t, g, rt, "exec_command", "true"); r.code != 2 || r.errEnv["kind"] != "invalid_request" {
		t.Errorf("missing --sandbox-id: exit %d %v", r.code, r.errEnv)
	}

	rec := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", ws)
	requireKeys(t, "sandbox_record", rec, keysSandboxRecord)
	id, _ := rec["id"].(string)
	if !strings.HasPrefix(id, "eos-") || rec["state"] != "ready" {
		t.Fatalf("create: %v", rec)
	}
	cleanupSandbox(t, id)
	requireKeys(t, "sandbox_record.daemon", sub(t, rec, "daemon"), keysEndpoint)
	if rec["daemon_http"] == nil && knownShapeGaps["sandbox_record.daemon_http:null"] {
		t.Logf("known shape gap: sandbox_record.daemon_http is null, want {host,port}")
	} else {
		requireKeys(t, "sandbox_record.daemon_http", sub(t, rec, "daemon_http"), keysEndpoint)
	}
	requireKeys(t, "sandbox_record", mustCLI(t, g, mgr, "inspect_sandbox", "--sandbox-id", id), keysSandboxRecord)
	sb := []string{"--sandbox-id", id}
	run := func(argv ...string) map[string]any { t.Helper(); return mustCLI(t, g, rt, append(sb, argv...)...) }

	// Bare exec: implicit session that publishes.
	out := run("exec_command", "cat f.txt; echo hi > h.txt")
	requireKeys(t, "command_output", out, keysCommandOutput)
	if out["status"] != "ok" || out["exit_code"] != float64(0) || !strings.Contains(fmt.Sprint(out["output"]), "base") {
		t.Fatalf("exec: %v", out)
	}
	if r := runCLI(t, g, rt, append(sb, "exec_command", "exit 3")...); r.code != 0 || r.out["status"] != "error" || r.out["exit_code"] != float64(3) {
		t.Errorf("exec exit 3: code %d %v %s", r.code, r.out, r.stderr)
	}

	// Sessionless file operations.
	w := run("file_write", "--path", "w.txt", "--content", "hello\nworld\n")
	requireKeys(t, "file_write", w, keysFileWrite)
	if w["type"] != "create" || w["bytes_written"] != float64(12) {
		t.Errorf("file_write: %v", w)
	}
	if w := run("file_write", "--path", "w.txt", "--content", "hello\nthere\n"); w["type"] != "update" {
		t.Errorf("file_write update: %v", w)
	}
	rd := run("file_read", "--path", "h.txt")
	requireKeys(t, "file_read", rd, keysFileRead)
	if rd["content"] != "hi" { // the seed's content: no final newline
		t.Errorf("file_read h.txt: %v", rd)
	}
	ed := run("file_edit", "--path", "w.txt", "--edits", `[{"old_string":"there","new_string":"edited"}]`)
	requireKeys(t, "file_edit", ed, keysFileEdit)
	if ed["type"] != "edit" || ed["edits_applied"] != float64(1) {
		t.Errorf("file_edit: %v", ed)
	}
	if rd := run("file_read", "--path", "w.txt"); rd["content"] != "hello\nedited" {
		t.Errorf("read after edit: %v", rd)
	}
	if rd := run("file_read", "--path", "w.txt", "--keep-final-newline"); rd["content"] != "hello\nedited\n" {
		t.Errorf("read after edit, keeping the final newline: %v", rd)
	}
	bl := run("file_blame", "--path", "w.txt")
	requireKeys(t, "file_blame", bl, keysBlame)
	ranges, _ := bl["ranges"].([]any)
	if len(ranges) == 0 {
		t.Errorf("file_blame: no ranges: %v", bl)
	}
	for _, r := range ranges {
		rm, _ := r.(map[string]any)
		requireKeys(t, "file_blame.range", rm, keysBlameRange)
		if o := fmt.Sprint(rm["owner"]); !strings.HasPrefix(o, "operation:") {
			t.Errorf("blame owner of a sessionless write: %q", o)
		}
	}
	if r := runCLI(t, g, rt, append(sb, "file_read", "--path", "missing.txt")...); r.code != 1 || r.errEnv["kind"] != "not_found" {
		t.Errorf("missing file: exit %d %v", r.code, r.errEnv)
	}

	// Sessions: two disjoint edits of one file publish, an overlapping third is rejected.
	sess := func() string {
		t.Helper()
		s := run("create_workspace_session")
		requireKeys(t, "create_workspace_session", s, keysCreateSession)
		if s["finalize_policy"] != "no_op" || s["network_profile"] != "shared" {
			t.Errorf("create_workspace_session: %v", s)
		}
		return fmt.Sprint(s["workspace_session_id"])
	}
	s1, s2, s3 := sess(), sess(), sess()
	so := run("exec_command", "--workspace-session-id", s1, "echo s1 > s1.txt && cat shared.txt")
	requireKeys(t, "command_output", so, keysCommandOutput)
	if so["status"] != "ok" || so["workspace_session_id"] != s1 {
		t.Errorf("session exec: %v", so)
	}
	run("file_edit", "--workspace-session-id", s1, "--path", "shared.txt", "--edits", `[{"old_string":"alpha","new_string":"ALPHA"}]`)
	run("file_edit", "--workspace-session-id", s2, "--path", "shared.txt", "--edits", `[{"old_string":"echo","new_string":"ECHO"}]`)
	run("file_edit", "--workspace-session-id", s3, "--path", "shared.txt", "--edits", `[{"old_string":"alpha","new_string":"aleph"}]`)
	if rd := run("file_read", "--workspace-session-id", s1, "--path", "s1.txt"); rd["content"] != "s1" {
		t.Errorf("session read: %v", rd)
	}
	for _, s := range []string{s1, s2} {
		p := run("publish_workspace_session", "--workspace-session-id", s)
		requireKeys(t, "publish_workspace_session", p, keysPublish)
		if p["destroyed"] != true || p["workspace_session_id"] != s {
			t.Errorf("publish %s: %v", s, p)
		}
		pi := sub(t, p, "publish")
		requireKeys(t, "publish_workspace_session.publish", pi, keysPublishInner)
		if pi["no_op"] != false {
			t.Errorf("publish %s: no_op %v", s, pi["no_op"])
		}
		requireKeys(t, "publish.revision", sub(t, pi, "revision"), keysRevision)
		requireKeys(t, "publish.route_summary", sub(t, pi, "route_summary"), keysRouteSummary)
	}
	if rd := run("file_read", "--path", "shared.txt"); rd["content"] != "ALPHA\nbravo\ncharlie\ndelta\nECHO" {
		t.Errorf("merged shared.txt: %q", rd["content"])
	}
	r3 := runCLI(t, g, rt, append(sb, "publish_workspace_session", "--workspace-session-id", s3)...)
	if r3.code != 1 || r3.errEnv["kind"] != "operation_failed" {
		t.Fatalf("overlapping publish: exit %d out %v err %v", r3.code, r3.out, r3.errEnv)
	}
	det := sub(t, r3.errEnv, "details")
	requireKeys(t, "publish_failure.details", det, keysPublishFailure)
	rej := sub(t, det, "publish_rejection")
	requireKeys(t, "publish_rejection", rej, keysRejection)
	if rej["reason"] != "source_conflict" || !strings.Contains(fmt.Sprint(rej["path"]), "shared.txt") || det["session_retained"] != true {
		t.Errorf("overlapping publish rejection: %v", det)
	}
	ds := run("destroy_workspace_session", "--workspace-session-id", s3)
	requireKeys(t, "destroy_workspace_session", ds, keysDestroySession)
	if ds["destroyed"] != true {
		t.Errorf("destroy session: %v", ds)
	}

	// Raw JSON lines vs HTTP.
	compareRawAndHTTP(t, g, id)

	// Export to a host directory.
	dest := t.TempDir()
	ex := mustCLI(t, g, mgr, "export_changes", "--sandbox-id", id, "--dest", dest)
	requireKeys(t, "export_changes.dir", ex, keysExportDir)
	if ex["format"] != "dir" {
		t.Errorf("export: %v", ex)
	}
	for name, want := range map[string]string{"h.txt": "hi\n", "w.txt": "hello\nedited\n", "s1.txt": "s1\n", "shared.txt": "ALPHA\nbravo\ncharlie\ndelta\nECHO\n"} {
		if b, err := os.ReadFile(filepath.Join(dest, name)); err != nil || string(b) != want {
			t.Errorf("exported %s: %q %v", name, b, err)
		}
	}

	fin := mustCLI(t, g, mgr, "destroy_sandbox", "--sandbox-id", id)
	requireKeys(t, "sandbox_record", fin, keysSandboxRecord)
	if fin["state"] != "stopped" {
		t.Errorf("destroy: %v", fin)
	}
	if c := dockerList(t, "container", id); len(c) != 0 {
		t.Errorf("containers left after destroy: %v", c)
	}
	if v := dockerList(t, "volume", id); len(v) != 0 {
		t.Errorf("volumes left after destroy: %v", v)
	}
	if n := dockerList(t, "network", id); len(n) != 0 {
		t.Errorf("networks left after destroy: %v", n)
	}
	for _, unknown := range []string{"eos-00000000-0000-0000-0000-000000000000", id} { // never created; destroyed
		if r := runCLI(t, g, mgr, "inspect_sandbox", "--sandbox-id", unknown); r.code != 1 || r.errEnv["kind"] != "invalid_request" ||
			r.errEnv["message"] != "sandbox not found: "+unknown {
			t.Errorf("unknown sandbox %s: exit %d %v", unknown, r.code, r.errEnv)
		}
	}
}

func compareRawAndHTTP(t *testing.T, g *gatewayProc, id string) {
	t.Helper()
	sbScope := map[string]any{"kind": "sandbox", "sandbox_id": id}
	sysScope := map[string]any{"kind": "system"}
	for _, c := range []struct {
		op    string
		scope map[string]any
		args  map[string]any
	}{
		{"file_read", sbScope, map[string]any{"path": "shared.txt"}},
		{"file_read", sbScope, map[string]any{"path": "w.txt", "offset": 2, "limit": 1}},
		{"inspect_sandbox", sysScope, map[string]any{"sandbox_id": id}},
		{"file_read", sbScope, map[string]any{"path": "nope.txt"}}, // not_found on both
	} {
		rid := "raw-" + client.NewRequestID()[:12]
		line, err := testenv.RawLine(g.Addr, map[string]any{"op": c.op, "request_id": rid, "scope": c.scope, "args": c.args, "_sandbox_gateway_auth_token": g.Token})
		if err != nil {
			t.Fatalf("raw %s: %v", c.op, err)
		}
		_, hb, err := g.HTTPOp(c.op, map[string]any{"scope": c.scope, "args": c.args, "request_id": "http-" + rid})
		if err != nil {
			t.Fatalf("http %s: %v", c.op, err)
		}
		var a, b map[string]any
		if json.Unmarshal(line, &a) != nil || json.Unmarshal(hb, &b) != nil {
			t.Fatalf("%s: raw %q http %q", c.op, line, hb)
		}
		stripRequestFields(a)
		stripRequestFields(b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s %v: raw JSON line and HTTP differ:\nraw  %s\nhttp %s", c.op, c.args, mustJSON(a), mustJSON(b))
		}
	}
	line, err := testenv.RawLine(g.Addr, map[string]any{"op": "list_sandboxes", "request_id": "bad-tok", "scope": sysScope, "args": map[string]any{}, "_sandbox_gateway_auth_token": "wrong"})
	if k := errKind(line); err != nil || k != "unauthorized" {
		t.Errorf("wrong token: %q %v", line, err)
	}
	line, err = testenv.RawLine(g.Addr, map[string]any{"op": "no_such_op", "request_id": "unk", "scope": sysScope, "args": map[string]any{}, "_sandbox_gateway_auth_token": g.Token})
	if k := errKind(line); err != nil || k != "unknown_op" {
		t.Errorf("unknown op: %q %v", line, err)
	}
}

// stripRequestFields drops request-specific values (ids, timings) before
// comparing a JSON-lines answer with an HTTP one.
func stripRequestFields(m map[string]any) {
	for _, k := range []string{"request_id", "trace_id", "wall_time_seconds", "command_total_time_seconds"} {
		delete(m, k)
	}
	if e, ok := m["error"].(map[string]any); ok {
		if d, ok := e["details"].(map[string]any); ok {
			delete(d, "request_id")
			delete(d, "trace_id")
		}
	}
}

func errKind(line []byte) string {
	var env struct {
		Error struct {
			Kind string `json:"kind"`
		} `json:"error"`
	}
	_ = json.Unmarshal(line, &env)
	return env.Error.Kind
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
