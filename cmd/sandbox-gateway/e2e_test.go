package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/cli"
	"github.com/ephemeral-sandbox/sandbox/gateway"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/worker"
)

// TestEndToEnd drives the real stack: CLI -> gateway (JSON lines and HTTP)
// -> embedded Temporal + workers -> Docker sandbox -> daemon.
func TestEndToEnd(t *testing.T) {
	testenv.RequireDocker(t)
	t.Setenv("SANDBOX_GATEWAY_TOKEN_FILE", filepath.Join(t.TempDir(), "none.token"))
	t.Setenv("SANDBOX_GATEWAY_AUTH_TOKEN", "")
	t.Setenv("SANDBOX_GATEWAY_SOCKET", "")
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	dc, err := activities.NewDockerClient()
	if err != nil {
		t.Fatal(err)
	}
	acts := activities.New(activities.Config{DaemonBinary: testenv.DaemonBinary(t), SeccompProfile: testenv.SeccompProfile(t),
		Secret: secret, WorkerID: "gateway-e2e", HostPaths: testenv.HostPaths(t)}, dc)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc, err := worker.Start(ctx, worker.Options{StateDir: t.TempDir(), EmbeddedAddress: "127.0.0.1:0", UIAddress: "off",
		Secret: secret, Activities: acts, HostQueue: "eos-host-gw-e2e-" + client.NewRequestID()[:8], Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	const token = "e2e-token"
	srv := gateway.New(&gateway.TemporalBackend{Client: svc.Client, HostQueue: svc.HostQueue, Secret: secret, HostPaths: testenv.HostPaths(t)}, token, log)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ctx, l) }()
	addr := l.Addr().String()

	cliRun := func(group string, argv ...string) map[string]any {
		t.Helper()
		var out, errb bytes.Buffer
		code := cli.Main(group, append([]string{"--gateway-endpoint", addr, "--gateway-auth-token", token}, argv...), &out, &errb)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", argv, code, errb.String())
		}
		var m map[string]any
		if err := json.Unmarshal(out.Bytes(), &m); err != nil {
			t.Fatalf("%v: %q", argv, out.String())
		}
		return m
	}

	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "f.txt"), []byte("base\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := cliRun(api.GroupManagement, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", ws)
	id, _ := rec["id"].(string)
	if !strings.HasPrefix(id, "eos-") || rec["state"] != "ready" {
		t.Fatalf("create: %v", rec)
	}
	t.Cleanup(func() { _ = acts.RemoveSandbox(context.Background(), id) })

	out := cliRun(api.GroupRuntime, "--sandbox-id", id, "exec_command", "cat f.txt; echo hi > h.txt")
	if out["status"] != "ok" || !strings.Contains(out["output"].(string), "base") {
		t.Fatalf("exec: %v", out)
	}
	httpc := client.New("http://"+addr, token)
	// The seed's window: the lines without the final newline; exact bytes
	// on request.
	raw, err := httpc.Call(ctx, "file_read", jsonl.SandboxScope(id), map[string]any{"path": "h.txt"}, "")
	if err != nil || !strings.Contains(string(raw), `"content":"hi"`) {
		t.Fatalf("file_read over HTTP: %s %v", raw, err)
	}
	checkServerTiming(t, addr, token, id, map[string]any{"path": "h.txt"}, http.StatusOK)
	checkServerTiming(t, addr, token, id, map[string]any{"path": "missing.txt"}, http.StatusNotFound)
	raw, err = httpc.Call(ctx, "file_read", jsonl.SandboxScope(id), map[string]any{"path": "h.txt", "keep_final_newline": true}, "")
	if err != nil || !strings.Contains(string(raw), `"content":"hi\n"`) {
		t.Fatalf("file_read keep_final_newline over HTTP: %s %v", raw, err)
	}
	lines := client.New(addr, token)
	if _, err := lines.Call(ctx, "file_write", jsonl.SandboxScope(id), map[string]any{"path": "w.txt", "content": "amended"}, ""); err != nil {
		t.Fatalf("sessionless file_write: %v", err)
	}
	raw, err = lines.Call(ctx, "file_read", jsonl.SandboxScope(id), map[string]any{"path": "w.txt"}, "")
	if err != nil || !strings.Contains(string(raw), `"content":"amended"`) {
		t.Fatalf("read back: %s %v", raw, err)
	}

	sess := cliRun(api.GroupRuntime, "--sandbox-id", id, "create_workspace_session")
	wsid, _ := sess["workspace_session_id"].(string)
	cliRun(api.GroupRuntime, "--sandbox-id", id, "exec_command", "--workspace-session-id", wsid, "echo s > s.txt")
	if chk := cliRun(api.GroupRuntime, "--sandbox-id", id, "check_publish", "--workspace-session-id", wsid); chk["clean"] != true {
		t.Errorf("check_publish: %v", chk)
	}
	pub := cliRun(api.GroupRuntime, "--sandbox-id", id, "publish_workspace_session", "--workspace-session-id", wsid)
	if pub["destroyed"] != true {
		t.Errorf("publish: %v", pub)
	}
	_, err = lines.Call(ctx, "file_read", jsonl.SandboxScope(id), map[string]any{"path": "missing.txt"}, "")
	if e := api.AsError(err); err == nil || e.Kind != api.KindNotFound {
		t.Errorf("missing file: %v", err)
	}
	_, err = lines.Call(ctx, "squash_layerstack", jsonl.SandboxScope(id), nil, "")
	if e := api.AsError(err); err == nil || e.Kind != api.KindInvalidRequest {
		t.Errorf("internal op: %v", err)
	}
	// The workflows view: the sandbox's workflow and the publish it recorded.
	wf := cliRun(api.GroupObservability, "--sandbox-id", id, "workflows")
	types := map[string]string{}
	var last map[string]any
	for _, w := range wf["workflows"].([]any) {
		m := w.(map[string]any)
		types[m["type"].(string)] = m["status"].(string)
		if lp, ok := m["last_publish"].(map[string]any); ok {
			last = lp
		}
	}
	if types["eos.SandboxWorkflow"] != "running" || last == nil || last["outcome"] != "committed" {
		t.Errorf("workflows view: %v", wf)
	}
	// An async lifecycle op returns once the workflow accepted it.
	acc := cliRun(api.GroupRuntime, "--sandbox-id", id, "create_workspace_session", "--async")
	if acc["status"] != "accepted" || acc["workflow_id"] != "sandbox/"+id {
		t.Errorf("async create_workspace_session: %v", acc)
	}
	list := cliRun(api.GroupManagement, "list_sandboxes")
	if !strings.Contains(mustJSON(list), id) {
		t.Errorf("list_sandboxes: %v", list)
	}
	fin := cliRun(api.GroupManagement, "destroy_sandbox", "--sandbox-id", id)
	if fin["state"] != "stopped" {
		t.Errorf("destroy: %v", fin)
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// checkServerTiming posts file_read with args and checks the answer's
// Server-Timing: the gateway's time, its daemon calls' and the daemon's
// own, each within the one before.
func checkServerTiming(t *testing.T, addr, token, id string, args map[string]any, code int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"scope": map[string]any{"kind": "sandbox", "sandbox_id": id}, "args": args})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/ops/file_read", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h := resp.Header.Get(api.ServerTimingHeader)
	st := api.ParseServerTiming(h)
	gw, ok1 := st.Get(api.TimingGateway)
	rpc, ok2 := st.Get(api.TimingDaemonRPC)
	d, ok3 := st.Get(api.TimingDaemon)
	if resp.StatusCode != code || !ok1 || !ok2 || !ok3 || d <= 0 || d > rpc || rpc > gw {
		t.Fatalf("file_read %v: status %d, Server-Timing %q", args, resp.StatusCode, h)
	}
}
