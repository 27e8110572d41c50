package mcp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcplib "github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/mcp"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.CleanupBinaries()
	os.Exit(code)
}

// agent is one MCP client with the progress notifications it received.
type agent struct {
	name string
	cl   *mcpclient.Client
	mu   sync.Mutex
	prog map[string][]string // progress token -> messages
}

func (a *agent) progressOf(token string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.prog[token]...)
}

// initAgent records the client's progress notifications and runs the
// 2025-06-18 initialize handshake most MCP clients speak today.
func initAgent(t *testing.T, name string, cl *mcpclient.Client) (*agent, error) {
	t.Helper()
	a := &agent{name: name, cl: cl, prog: map[string][]string{}}
	cl.OnNotification(func(n mcplib.JSONRPCNotification) {
		if n.Method != string(mcplib.MethodNotificationProgress) {
			return
		}
		tok := fmt.Sprint(n.Params.AdditionalFields["progressToken"])
		msg, _ := n.Params.AdditionalFields["message"].(string)
		a.mu.Lock()
		a.prog[tok] = append(a.prog[tok], msg)
		a.mu.Unlock()
	})
	req := mcplib.InitializeRequest{}
	req.Params.ClientInfo = mcplib.Implementation{Name: name, Version: "1"}
	req.Params.ProtocolVersion = mcplib.ProtocolVersion20250618
	if _, err := cl.Initialize(t.Context(), req); err != nil {
		_ = cl.Close()
		return nil, err
	}
	t.Cleanup(func() { _ = cl.Close() })
	return a, nil
}

// stdioAgent launches sandbox-mcp as a subprocess, the way Codex or Claude
// Code do.
func stdioAgent(t *testing.T, g *testenv.Gateway, set, name string) *agent {
	t.Helper()
	cl, err := mcpclient.NewStdioMCPClient(filepath.Join(g.Bins, "sandbox-mcp"),
		append(os.Environ(), "HOME="+g.Home, "SANDBOX_GATEWAY_AUTH_TOKEN=", "SANDBOX_GATEWAY_SOCKET="),
		"--set", set, "--gateway-endpoint", g.Addr, "--gateway-auth-token", g.Token)
	require.NoError(t, err)
	// The transport is running; Start wires the client's notification
	// handlers to it.
	require.NoError(t, cl.Start(t.Context()))
	a, err := initAgent(t, name, cl)
	require.NoError(t, err, "%s: initialize", name)
	return a
}

// httpAgent speaks streamable HTTP to the gateway's /mcp/<set>.
func httpAgent(t *testing.T, g *testenv.Gateway, set, name, token string) (*agent, error) {
	t.Helper()
	cl, err := mcpclient.NewStreamableHttpClient("http://"+g.Addr+"/mcp/"+set,
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	require.NoError(t, err)
	require.NoError(t, cl.Start(t.Context()))
	return initAgent(t, name, cl)
}

// call runs a tool; with token it asks for progress under that token.
func (a *agent) call(t *testing.T, tool string, args map[string]any, token string) (map[string]any, string, bool) {
	t.Helper()
	req := mcplib.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = tool, args
	if token != "" {
		req.Params.Meta = &mcplib.Meta{ProgressToken: token}
	}
	res, err := a.cl.CallTool(t.Context(), req)
	require.NoError(t, err, "%s %s: tool failures must be tool results", a.name, tool)
	require.NotEmpty(t, res.Content, "%s %s: text content for text-only clients", a.name, tool)
	return structured(t, res), text(res), res.IsError
}

func (a *agent) must(t *testing.T, tool string, args map[string]any) map[string]any {
	t.Helper()
	m, txt, isErr := a.call(t, tool, args, "")
	require.False(t, isErr, "%s %s: %s", a.name, tool, txt)
	return m
}

func listToolNames(t *testing.T, a *agent, set string) {
	t.Helper()
	res, err := a.cl.ListTools(t.Context(), mcplib.ListToolsRequest{})
	require.NoError(t, err)
	got := map[string]json.RawMessage{}
	for _, tool := range res.Tools {
		b, err := json.Marshal(tool.InputSchema)
		require.NoError(t, err)
		if tool.RawInputSchema != nil {
			b = tool.RawInputSchema
		}
		got[tool.Name] = b
		require.NotNil(t, tool.Annotations.ReadOnlyHint, tool.Name)
	}
	ops := api.PublicOps(set)
	require.Len(t, got, len(ops), "%s: one tool per catalog op", set)
	for i := range ops {
		want, _ := json.Marshal(mcp.InputSchema(set, &ops[i]))
		require.JSONEq(t, normSchema(t, want), normSchema(t, got[ops[i].Name]), "%s.%s: schema as generated from the catalog", set, ops[i].Name)
	}
}

// eventually waits for a progress message containing want: notifications
// may reach the client just after the result.
func eventually(t *testing.T, a *agent, token, want string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(strings.Join(a.progressOf(token), "\n"), want) },
		10*time.Second, 10*time.Millisecond, "%s: progress %q lacks %q", a.name, a.progressOf(token), want)
}

// normSchema drops an empty "required" (the client library adds one when it
// decodes a schema without it).
func normSchema(t *testing.T, b []byte) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	if r, ok := m["required"].([]any); ok && len(r) == 0 {
		delete(m, "required")
	}
	out, _ := json.Marshal(m)
	return string(out)
}

// TestAgentsOverMCP drives three agents through the real stack (gateway
// process, embedded Temporal, Docker sandbox, daemon): two over stdio
// servers, one over the gateway's HTTP endpoint. Each works in its own
// session; two edit different lines of one file and merge; the third edits
// a line another changed, gets a conflict it can read, fixes its change in
// a new session and publishes.
func TestAgentsOverMCP(t *testing.T) {
	g := testenv.StartGateway(t)

	// Tool lists and schemas over both transports.
	for _, set := range mcp.Sets() {
		listToolNames(t, stdioAgent(t, g, set, "lister-stdio-"+set), set)
		ha, err := httpAgent(t, g, set, "lister-http-"+set, g.Token)
		require.NoError(t, err)
		listToolNames(t, ha, set)
	}
	_, err := httpAgent(t, g, mcp.SetRuntime, "intruder", "wrong-token")
	require.Error(t, err, "the HTTP endpoint needs the gateway token")

	// A sandbox over a workspace with one shared file of ten lines.
	ws := t.TempDir()
	var lines []string
	for i := 1; i <= 10; i++ {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	require.NoError(t, os.WriteFile(filepath.Join(ws, "shared.txt"), []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	mgr := stdioAgent(t, g, mcp.SetManagement, "manager")
	rec, txt, isErr := mgr.call(t, "create_sandbox", map[string]any{"image": testenv.Images[0], "workspace_root": ws}, "create-1")
	require.False(t, isErr, txt)
	id, _ := rec["id"].(string)
	require.True(t, strings.HasPrefix(id, "eos-"), "%v", rec)
	t.Cleanup(func() { testenv.RemoveSandboxObjects(t, id) })
	require.Equal(t, "ready", rec["state"])
	require.Contains(t, txt, "id: "+id)
	eventually(t, mgr, "create-1", "sandbox "+id+" ready")

	alice := stdioAgent(t, g, mcp.SetRuntime, "alice")
	bob, err := httpAgent(t, g, mcp.SetRuntime, "bob", g.Token)
	require.NoError(t, err)
	carol := stdioAgent(t, g, mcp.SetRuntime, "carol")
	session := func(a *agent) string {
		m := a.must(t, "create_workspace_session", map[string]any{"sandbox_id": id, "agent": a.name})
		wsid, _ := m["workspace_session_id"].(string)
		require.NotEmpty(t, wsid)
		return wsid
	}
	edit := func(a *agent, wsid, old, new string) {
		m := a.must(t, "file_edit", map[string]any{"sandbox_id": id, "workspace_session_id": wsid, "path": "shared.txt",
			"edits": []any{map[string]any{"old_string": old + "\n", "new_string": new + "\n"}}})
		require.Equal(t, float64(1), m["replacements"])
	}
	wsA, wsB, wsC := session(alice), session(bob), session(carol)
	edit(alice, wsA, "line 2", "line 2 by alice")
	edit(bob, wsB, "line 8", "line 8 by bob")
	edit(carol, wsC, "line 2", "line 2 by carol")

	// A command's output streams as progress while it runs.
	out, txt, isErr := alice.call(t, "exec_command", map[string]any{"sandbox_id": id, "workspace_session_id": wsA,
		"cmd": "for i in 1 2 3; do echo tick$i; sleep 0.2; done; echo oops >&2", "yield_time_ms": 20000}, "exec-1")
	require.False(t, isErr, txt)
	require.Equal(t, "ok", out["status"])
	require.Contains(t, txt, "tick3")
	require.Eventually(t, func() bool {
		p := strings.Join(alice.progressOf("exec-1"), "\n")
		return strings.Contains(p, "tick1") && strings.Contains(p, "tick3") && strings.Contains(p, "[stderr] oops")
	}, 10*time.Second, 20*time.Millisecond, "command lines arrive as progress: %q", alice.progressOf("exec-1"))
	out, _, _ = bob.call(t, "exec_command", map[string]any{"sandbox_id": id, "workspace_session_id": wsB,
		"cmd": "echo one; sleep 0.3; echo two", "yield_time_ms": 20000}, "exec-2")
	require.Equal(t, "ok", out["status"])
	eventually(t, bob, "exec-2", "two") // over streamable HTTP too

	// Alice and Bob publish: disjoint lines merge.
	pubA, txt, isErr := alice.call(t, "publish_workspace_session", map[string]any{"sandbox_id": id, "workspace_session_id": wsA}, "pub-a")
	require.False(t, isErr, txt)
	require.Equal(t, true, pubA["destroyed"])
	eventually(t, alice, "pub-a", "published: manifest version")
	_, txt, isErr = bob.call(t, "publish_workspace_session", map[string]any{"sandbox_id": id, "workspace_session_id": wsB}, "")
	require.False(t, isErr, txt)

	// Carol's line 2 conflicts with Alice's: nothing is committed, and the
	// error says where.
	rej, txt, isErr := carol.call(t, "publish_workspace_session", map[string]any{"sandbox_id": id, "workspace_session_id": wsC}, "pub-c")
	require.True(t, isErr, "the conflicting publish fails")
	e := rej["error"].(map[string]any)
	require.Equal(t, "operation_failed", e["kind"])
	details := e["details"].(map[string]any)
	require.Equal(t, true, details["session_retained"])
	conflicts := details["conflicts"].([]any)
	require.Len(t, conflicts, 1)
	require.Equal(t, "shared.txt", conflicts[0].(map[string]any)["path"])
	require.Contains(t, txt, "- shared.txt:")
	require.Contains(t, txt, "line 2", "the text rendering names the conflicting lines")
	eventually(t, carol, "pub-c", "publish rejected")

	head := carol.must(t, "file_read", map[string]any{"sandbox_id": id, "path": "shared.txt"})
	require.Contains(t, head["content"], "line 2 by alice")
	require.Contains(t, head["content"], "line 8 by bob")
	require.NotContains(t, head["content"], "carol", "a rejected publish commits nothing")

	// Carol fixes it: a fresh session on the new head, her change on top.
	carol.must(t, "destroy_workspace_session", map[string]any{"sandbox_id": id, "workspace_session_id": wsC})
	wsC2 := session(carol)
	edit(carol, wsC2, "line 2 by alice", "line 2 by alice, then carol")
	_, txt, isErr = carol.call(t, "publish_workspace_session", map[string]any{"sandbox_id": id, "workspace_session_id": wsC2}, "")
	require.False(t, isErr, txt)

	final := bob.must(t, "file_read", map[string]any{"sandbox_id": id, "path": "shared.txt", "keep_final_newline": true})
	content := final["content"].(string)
	require.Contains(t, content, "line 2 by alice, then carol\n")
	require.Contains(t, content, "line 8 by bob\n")
	require.Contains(t, content, "line 10\n")

	// Bad input comes back as a tool error the model can read.
	for _, bad := range []map[string]any{
		{"sandbox_id": id, "path": "../../etc/passwd"},
		{"sandbox_id": id, "path": "shared.txt", "bogus": 1},
		{"sandbox_id": "eos-nope", "path": "shared.txt"},
	} {
		m, txt, isErr := carol.call(t, "file_read", bad, "")
		require.True(t, isErr, "%v: %s", bad, txt)
		require.NotEmpty(t, m["error"].(map[string]any)["kind"])
	}

	// Observability over HTTP: the workflows behind the sandbox.
	obs, err := httpAgent(t, g, mcp.SetObservability, "observer", g.Token)
	require.NoError(t, err)
	wf := obs.must(t, "workflows", map[string]any{"sandbox_id": id})
	require.NotEmpty(t, wf["workflows"])
	hist := obs.must(t, "publish_history", map[string]any{"sandbox_id": id})["publishes"].([]any)
	var outcomes []string
	for _, p := range hist {
		outcomes = append(outcomes, p.(map[string]any)["agent"].(string)+":"+p.(map[string]any)["outcome"].(string))
	}
	require.Contains(t, outcomes, "carol:conflict", "the publish history tells who conflicted")
	fleet := obs.must(t, "snapshot", map[string]any{})
	require.NotEmpty(t, fleet["sandboxes"], "snapshot without sandbox_id is the fleet")

	mgrHTTP, err := httpAgent(t, g, mcp.SetManagement, "manager-http", g.Token)
	require.NoError(t, err)
	dest := t.TempDir()
	exp, txt, isErr := mgrHTTP.call(t, "export_changes", map[string]any{"sandbox_id": id, "dest": dest}, "export-1")
	require.False(t, isErr, txt)
	require.Equal(t, "dir", exp["format"])
	eventually(t, mgrHTTP, "export-1", "export done")
	exported, err := os.ReadFile(filepath.Join(dest, "shared.txt"))
	require.NoError(t, err)
	require.Equal(t, content, string(exported), "the merged file reaches the host")
	gone := mgrHTTP.must(t, "destroy_sandbox", map[string]any{"sandbox_id": id})
	require.Equal(t, "stopped", gone["state"])
}

// TestStdioWritesOnlyProtocol checks the raw stdout of sandbox-mcp: every
// line is a JSON-RPC message, even when the gateway is unreachable and the
// tool fails.
func TestStdioWritesOnlyProtocol(t *testing.T) {
	bins := testenv.Binaries(t)
	cmd := exec.Command(filepath.Join(bins, "sandbox-mcp"), "--set", "runtime", "--gateway-endpoint", "127.0.0.1:1", "--gateway-auth-token", "x") // nothing listens on port 1
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	msgs := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"file_read","arguments":{"sandbox_id":"eos-x","path":"a"}}}`,
	}
	for _, m := range msgs {
		_, err := stdin.Write([]byte(m + "\n"))
		require.NoError(t, err)
	}
	r := bufio.NewReader(stdout)
	seen := map[float64]map[string]any{}
	for len(seen) < 3 {
		line, err := r.ReadBytes('\n')
		require.NoError(t, err, "stderr: %s", stderr.String())
		var m map[string]any
		require.NoError(t, json.Unmarshal(line, &m), "stdout holds only JSON-RPC: %q", line)
		require.Equal(t, "2.0", m["jsonrpc"])
		if id, ok := m["id"].(float64); ok {
			seen[id] = m
		}
	}
	res := seen[3]["result"].(map[string]any)
	require.Equal(t, true, res["isError"], "an unreachable gateway is a tool error: %v", res)
	require.Contains(t, fmt.Sprint(res["content"]), "connection_error")
	require.Contains(t, stderr.String(), "sandbox-mcp serving on stdio", "logs go to stderr")
}
