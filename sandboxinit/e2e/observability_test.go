package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/spreaddir"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// callRID runs an RPC with X-Request-Id rid (its trace id).
func (sb *sandbox) callRID(rid, op string, args any) (int, map[string]any) {
	sb.t.Helper()
	return sb.request(op, args, map[string]string{"Authorization": "Bearer " + sb.token, "X-Request-Id": rid})
}

func field(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, _ := v.(map[string]any)
		v = mm[p]
	}
	return v
}

// TestObservability drives a sandbox through sessions, commands, a merge, a
// conflict, an implicit publish and a sessionless write, then checks every
// view against the seed's shapes and what they say; then that an idle
// sandbox samples nothing and that reading views changes nothing on disk.
func TestObservability(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	a := sb.session(map[string]any{"agent": "alice"})
	b := sb.session(map[string]any{"agent": "bob"})
	c := sb.session(map[string]any{"agent": "carol"})
	d := sb.session(map[string]any{"agent": "dave", "network_profile": "isolated"})
	sb.exec(a, "sed -i 's/^line 3$/LINE THREE/' f.txt")
	sb.exec(b, "sed -i 's/^line 7$/LINE SEVEN/' f.txt")
	sb.exec(c, "sed -i 's/^line 3$/line three, differently/' f.txt")

	// A command still running shows in the snapshot (it runs until it
	// reads a line, sent once the checks are done).
	run := sb.ok("exec_command", map[string]any{"cmd": "echo started; read x", "workspace_session_id": d, "yield_time_ms": 200})
	require.Equal(t, "running", run["status"])
	snap := sb.ok("snapshot", map[string]any{"sandbox_id": "eos-e2e"})
	var execs []any
	for _, w := range snap["workspaces"].([]any) {
		if w.(map[string]any)["workspace_id"] == d {
			execs = w.(map[string]any)["active_namespace_executions"].([]any)
			require.GreaterOrEqual(t, w.(map[string]any)["namespace_fd_count"], float64(5), "mnt, pid, ipc, uts and net of an isolated session")
		}
	}
	require.Len(t, execs, 1)
	require.Equal(t, run["command_session_id"], execs[0].(map[string]any)["namespace_execution_id"])
	require.Equal(t, "echo started; read x", execs[0].(map[string]any)["command"])
	top := sb.ok("topology", map[string]any{})["topology"].(map[string]any)
	require.Equal(t, true, top["available"])
	for _, w := range top["workspaces"].([]any) {
		wm := w.(map[string]any)
		require.Greater(t, wm["holder_pid"], float64(1), "%v", wm)
		kinds := map[string]bool{}
		for _, p := range wm["processes"].([]any) {
			kinds[p.(map[string]any)["kind"].(string)] = true
		}
		require.True(t, kinds["namespace_init"], "%s lists its namespace init: %v", wm["workspace_id"], wm["processes"])
		if wm["workspace_id"] == d {
			require.Equal(t, "active", wm["state"])
		}
	}
	sb.ok("write_command_stdin", map[string]any{"command_session_id": run["command_session_id"], "stdin": "\n"})
	require.Eventually(t, func() bool {
		out := sb.ok("read_command_lines", map[string]any{"command_session_id": run["command_session_id"]})
		return out["status"] == "ok"
	}, time.Minute, 100*time.Millisecond)

	// Publishes: clean, merged, conflict; then an implicit one and a
	// sessionless write.
	code, out := sb.callRID("e2e-pub-a", "publish_workspace_session", map[string]any{"workspace_session_id": a, "message": "three"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = sb.callRID("e2e-pub-b", "publish_workspace_session", map[string]any{"workspace_session_id": b})
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.Equal(t, []any{"f.txt"}, field(out, "publish", "merged_paths"))
	code, out = sb.callRID("e2e-pub-c", "publish_workspace_session", map[string]any{"workspace_session_id": c})
	require.NotEqual(t, http.StatusOK, code, "%v", out)
	code, out = sb.callRID("e2e-implicit", "exec_command", map[string]any{"cmd": "echo hi > implicit.txt", "yield_time_ms": 60000})
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.NotContains(t, out, "publish_rejected", "a clean implicit publish carries no publish_rejected key")
	code, out = sb.callRID("e2e-write", "file_write", map[string]any{"path": "notes.md", "content": "n\n"})
	require.Equal(t, http.StatusOK, code, "%v", out)

	// A streamed exec (output lines as they come) is traced like any call.
	body, _ := json.Marshal(map[string]any{"cmd": "echo streamed", "workspace_session_id": d, "yield_time_ms": 60000})
	req, err := http.NewRequest(http.MethodPost, sb.baseURL+"/rpc/exec_command", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+sb.token)
	req.Header.Set("X-Request-Id", "e2e-streamed")
	req.Header.Set("Accept", api.ContentTypeNDJSON)
	resp, err := sb.client.Do(req)
	require.NoError(t, err)
	streamed, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(streamed), "streamed")

	call := func(op string, args map[string]any) map[string]any {
		if args == nil {
			args = map[string]any{}
		}
		return sb.ok(op, args)
	}
	testenv.CheckObservabilityViews(t, call)

	// The trace of bob's publish, nested.
	tr := call("trace", map[string]any{"trace_id": "e2e-pub-b"})
	root := tr["spans"].([]any)[0].(map[string]any)
	require.Equal(t, "daemon.dispatch", field(root, "span", "name"))
	pub := root["children"].([]any)[0].(map[string]any)
	require.Equal(t, "workspace_session.publish", field(pub, "span", "name"))
	require.Equal(t, "completed", field(pub, "span", "status"))
	var names []string
	for _, ch := range pub["children"].([]any) {
		names = append(names, field(ch.(map[string]any), "span", "name").(string))
	}
	require.Equal(t, []string{"workspace_session.capture_changes", "layerstack.publish", "workspace_session.finalize"}, names)
	// The implicit exec's trace holds its command and its publish.
	itr := call("trace", map[string]any{"trace_id": "e2e-implicit"})
	var all []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		all = append(all, field(n, "span", "name").(string))
		for _, ch := range n["children"].([]any) {
			walk(ch.(map[string]any))
		}
	}
	for _, s := range itr["spans"].([]any) {
		walk(s.(map[string]any))
	}
	for _, want := range []string{"daemon.dispatch", "command.exec", "workspace_session.create", "workspace_session.publish", "layerstack.publish"} {
		require.Contains(t, all, want)
	}

	st := call("trace", map[string]any{"trace_id": "e2e-streamed"})["spans"].([]any)
	require.Len(t, st, 1)
	require.Equal(t, "command.exec", field(st[0].(map[string]any)["children"].([]any)[0].(map[string]any), "span", "name"))

	// Who published what.
	hist := call("publish_history", nil)["publishes"].([]any)
	byTrace := map[string]map[string]any{}
	for _, h := range hist {
		byTrace[h.(map[string]any)["trace"].(string)] = h.(map[string]any)
	}
	require.Equal(t, "clean", byTrace["e2e-pub-a"]["outcome"])
	require.Equal(t, "alice", byTrace["e2e-pub-a"]["agent"])
	require.Equal(t, "merged", byTrace["e2e-pub-b"]["outcome"])
	require.Equal(t, "bob", byTrace["e2e-pub-b"]["agent"])
	require.Equal(t, "conflict", byTrace["e2e-pub-c"]["outcome"])
	require.Equal(t, "carol", byTrace["e2e-pub-c"]["agent"])
	require.Equal(t, "f.txt", byTrace["e2e-pub-c"]["conflicts"].([]any)[0].(map[string]any)["path"])
	require.Equal(t, "implicit", byTrace["e2e-implicit"]["source"])
	require.Equal(t, "sessionless", byTrace["e2e-write"]["source"])
	require.Equal(t, "e2e-write", hist[0].(map[string]any)["trace"], "newest first")

	// Samples: the sandbox's cgroup and a session's.
	// The sampler runs every 2 s: wait for a round that saw the stack
	// (after the publishes) and session d.
	var res map[string]any
	scopes := map[string]map[string]any{}
	require.Eventually(t, func() bool {
		res = call("resources", map[string]any{"window_ms": 600000})
		clear(scopes)
		for _, s := range res["series"].([]any) {
			scopes[s.(map[string]any)["scope"].(string)] = s.(map[string]any)
		}
		return scopes["stack"] != nil && scopes["sandbox"] != nil && scopes[d] != nil
	}, 30*time.Second, 200*time.Millisecond, "a sampler round after the publishes")
	require.Greater(t, scopes["sandbox"]["memory_bytes"], float64(0), "%v", scopes["sandbox"])
	require.Greater(t, scopes["sandbox"]["cpu_usage_usec"], float64(0))
	require.Nil(t, scopes["sandbox"]["errors"], "the sandbox's cgroup reads cleanly: %v", scopes["sandbox"]["errors"])
	require.NotNil(t, scopes["stack"])
	require.Equal(t, "sandbox", field(res, "latest", "scope"), "resources.latest is the newest sandbox sample")
	cg := call("cgroup", map[string]any{"scope": d, "window_ms": 600000})
	series := cg["series"].([]any)
	require.NotEmpty(t, series)
	last := series[len(series)-1].(map[string]any)
	require.GreaterOrEqual(t, last["pids"], float64(1), "%v", last)
	require.Greater(t, last["memory_bytes"], float64(0), "%v", last)
	require.Nil(t, last["errors"], "the session's cgroup reads cleanly: %v", last["errors"])

	// Idle: the sampler stops by itself and writes nothing more.
	sampler := func() map[string]any { return field(call("daemon", nil), "daemon", "sampler").(map[string]any) }
	require.Eventually(t, func() bool { return sampler()["running"] == false }, time.Minute, 250*time.Millisecond)
	files := func() string {
		return docker(t, "exec", sb.name, "sh", "-c", "ls -l /eos/observability; sha256sum /eos/observability/*")
	}
	idle := files()
	require.Never(t, func() bool { return files() != idle }, 5*time.Second, 500*time.Millisecond, "an idle sandbox appends nothing")

	// Reading every view 100 times changes nothing and wakes nothing.
	starts := sampler()["starts"]
	// On ext4 (this machine's Docker volumes) the state volume's busy
	// directories spread their subdirectories (spreaddir).
	if ext4, err := spreaddir.Supported("/var/lib/docker"); err == nil && ext4 {
		spread := field(call("daemon", nil), "daemon", "ownership", "spread_dirs").(map[string]any)
		require.Len(t, spread, 5)
		for d, on := range spread {
			require.Equal(t, true, on, "%s is not spread", d)
		}
	}
	heap0 := field(call("daemon", nil), "daemon", "runtime", "heap_inuse_bytes").(float64)
	for i := 0; i < 100; i++ {
		testenv.CheckObservabilityViews(t, call)
	}
	require.Equal(t, idle, files(), "views changed the observability store")
	require.Equal(t, starts, sampler()["starts"], "views woke the sampler")
	heap1 := field(call("daemon", nil), "daemon", "runtime", "heap_inuse_bytes").(float64)
	require.Less(t, heap1-heap0, float64(16<<20), "daemon heap in use %v -> %v", heap0, heap1)
	t.Logf("daemon heap in use %.0f -> %.0f bytes; store:\n%s", heap0, heap1, strings.TrimSpace(idle))

	// The store is on the state volume: a container restart keeps it.
	docker(t, "restart", "-t", "5", sb.name)
	sb.connect()
	require.Len(t, call("publish_history", nil)["publishes"], len(hist))
	require.Equal(t, "e2e-pub-b", call("trace", map[string]any{"trace_id": "e2e-pub-b"})["trace"])
	require.NotEmpty(t, call("trace", map[string]any{"trace_id": "e2e-pub-b"})["spans"])
}
