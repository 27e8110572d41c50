package mcp_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcplib "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/mcp"
)

// fakeCaller records calls and answers from a table.
type fakeCaller struct {
	mu     sync.Mutex
	calls  []fakeCall
	answer func(op string, args map[string]any, progress func(string)) (json.RawMessage, error)
}

type fakeCall struct {
	op    string
	scope jsonl.Scope
	args  map[string]any
	rid   string
}

func (f *fakeCaller) CallProgress(ctx context.Context, op string, scope jsonl.Scope, args map[string]any, rid string, progress func(string)) (json.RawMessage, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{op, scope, args, rid})
	f.mu.Unlock()
	if f.answer != nil {
		return f.answer(op, args, progress)
	}
	return json.RawMessage(`{"ok":true}`), nil
}

func (f *fakeCaller) last() fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[len(f.calls)-1]
}

// connect starts an in-process client on the set's server; legacy pins the
// 2025-06-18 initialize handshake most MCP clients speak today.
func connect(t *testing.T, set string, c mcp.Caller, legacy bool) *mcpclient.Client {
	t.Helper()
	srv, err := mcp.NewServer(set, c, mcp.Options{ProgressInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	var opts []mcpclient.ClientOption
	if legacy {
		// Deprecated upstream, but it is the handshake today's clients
		// (Codex, Claude Code) speak: the server must keep serving it.
		//lint:ignore SA1019 the legacy handshake is what is under test
		opts = append(opts, mcpclient.WithLegacyProtocolOnly())
	}
	cl, err := mcpclient.NewInProcessClientWithOptions(srv, opts...)
	require.NoError(t, err)
	require.NoError(t, cl.Start(t.Context()))
	req := mcplib.InitializeRequest{}
	req.Params.ClientInfo = mcplib.Implementation{Name: "mcp-test", Version: "1"}
	if legacy {
		req.Params.ProtocolVersion = mcplib.ProtocolVersion20250618
	}
	_, err = cl.Initialize(t.Context(), req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func callTool(t *testing.T, cl *mcpclient.Client, name string, args map[string]any) *mcplib.CallToolResult {
	t.Helper()
	req := mcplib.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := cl.CallTool(t.Context(), req)
	require.NoError(t, err, "a failing tool must be a tool result, not a protocol error")
	return res
}

func text(r *mcplib.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := mcplib.AsTextContent(c); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func structured(t *testing.T, r *mcplib.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(r.StructuredContent)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func TestToolsPerSetMatchTheCatalog(t *testing.T) {
	for _, set := range mcp.Sets() {
		t.Run(set, func(t *testing.T) {
			cl := connect(t, set, &fakeCaller{}, false)
			res, err := cl.ListTools(t.Context(), mcplib.ListToolsRequest{})
			require.NoError(t, err)
			want := map[string]bool{}
			for _, op := range api.PublicOps(set) {
				want[op.Name] = true
			}
			got := map[string]bool{}
			for _, tool := range res.Tools {
				got[tool.Name] = true
			}
			require.Equal(t, want, got)
		})
	}
}

// The seed's tool names are all there, in the seed's sets.
func TestSeedToolNames(t *testing.T) {
	seed := map[string][]string{
		mcp.SetManagement: {"create_sandbox", "list_docker_images", "list_workspace_directories", "destroy_sandbox", "list_sandboxes",
			"inspect_sandbox", "squash_layerstacks", "export_changes"},
		mcp.SetRuntime: {"exec_command", "write_command_stdin", "read_command_lines", "file_read", "file_write", "file_edit",
			"file_blame", "create_workspace_session", "publish_workspace_session", "destroy_workspace_session"},
		mcp.SetObservability: {"snapshot", "trace", "events", "resources", "daemon", "topology", "cgroup", "layerstack"},
	}
	for set, names := range seed {
		tools := map[string]mcplib.Tool{}
		for _, tool := range mcp.Tools(set) {
			tools[tool.Name] = tool
		}
		for _, n := range names {
			require.Contains(t, tools, n, "set %s", set)
		}
	}
}

func TestInputSchemas(t *testing.T) {
	for _, set := range mcp.Sets() {
		ops := api.PublicOps(set)
		for i := range ops {
			op := &ops[i]
			s := mcp.InputSchema(set, op)
			require.Equal(t, "object", s["type"], op.Name)
			require.Equal(t, false, s["additionalProperties"], "%s: unknown args must be refused", op.Name)
			props := s["properties"].(map[string]any)
			req, _ := s["required"].([]string)
			for _, a := range op.Args {
				p := props[a.Name].(map[string]any)
				require.NotEmpty(t, p["description"], "%s.%s", op.Name, a.Name)
				if a.Required {
					require.Contains(t, req, a.Name, "%s.%s", op.Name, a.Name)
				}
				if a.Default != nil {
					require.Equal(t, a.Default, p["default"], "%s.%s", op.Name, a.Name)
				}
				if a.Type == api.TypeInt {
					require.Contains(t, p, "minimum", "%s.%s: integers have a minimum", op.Name, a.Name)
					if a.Max != nil {
						require.Equal(t, *a.Max, p["maximum"], "%s.%s", op.Name, a.Name)
					}
				}
			}
			switch {
			case set == mcp.SetRuntime:
				require.Contains(t, req, "sandbox_id", "runtime tool %s requires sandbox_id", op.Name)
			case set == mcp.SetObservability && op.Scope == api.ScopeSandbox:
				require.Contains(t, req, "sandbox_id", op.Name)
			case set == mcp.SetObservability && op.Scope == api.ScopeEither:
				require.Contains(t, props, "sandbox_id", op.Name)
				require.NotContains(t, req, "sandbox_id", "%s: fleet form without sandbox_id", op.Name)
			}
			// Valid JSON Schema the client library can parse.
			b, err := json.Marshal(s)
			require.NoError(t, err)
			var ti mcplib.ToolInputSchema
			require.NoError(t, json.Unmarshal(b, &ti), op.Name)
		}
	}
	edit, _ := api.LookupOp("file_edit")
	items := mcp.InputSchema(mcp.SetRuntime, edit)["properties"].(map[string]any)["edits"].(map[string]any)["items"].(map[string]any)
	require.Equal(t, []string{"old_string", "new_string"}, items["required"])
}

func TestAnnotations(t *testing.T) {
	tools := map[string]mcplib.Tool{}
	for _, set := range mcp.Sets() {
		for _, tool := range mcp.Tools(set) {
			tools[tool.Name] = tool
			require.NotNil(t, tool.Annotations.ReadOnlyHint, tool.Name)
			require.NotNil(t, tool.Annotations.DestructiveHint, tool.Name)
			require.NotNil(t, tool.Annotations.IdempotentHint, tool.Name)
			require.NotEmpty(t, tool.Description, tool.Name)
		}
	}
	ro := func(n string) bool { return *tools[n].Annotations.ReadOnlyHint }
	destr := func(n string) bool { return *tools[n].Annotations.DestructiveHint }
	idem := func(n string) bool { return *tools[n].Annotations.IdempotentHint }
	for _, n := range []string{"file_read", "list_sandboxes", "snapshot", "trace", "events", "layerstack", "diff_workspace_session", "check_publish"} {
		require.True(t, ro(n), n)
		require.False(t, destr(n), n)
		require.True(t, idem(n), n)
	}
	for _, n := range []string{"destroy_sandbox", "destroy_workspace_session", "file_delete", "exec_command"} {
		require.False(t, ro(n), n)
		require.True(t, destr(n), n)
	}
	require.False(t, ro("publish_workspace_session"))
	require.False(t, destr("publish_workspace_session"), "a publish commits or changes nothing")
	require.True(t, idem("destroy_sandbox"))
	require.False(t, idem("create_sandbox"))
}

func TestRoutingBySandboxID(t *testing.T) {
	f := &fakeCaller{}
	cl := connect(t, mcp.SetRuntime, f, false)
	res := callTool(t, cl, "file_read", map[string]any{"sandbox_id": "eos-1", "path": "a.txt"})
	require.False(t, res.IsError, text(res))
	c := f.last()
	require.Equal(t, "file_read", c.op)
	require.Equal(t, jsonl.SandboxScope("eos-1"), c.scope)
	require.Equal(t, map[string]any{"path": "a.txt"}, c.args, "sandbox_id is the scope, not an op arg")
	require.NotEmpty(t, c.rid)
	require.Equal(t, c.rid, res.Meta.AdditionalFields["request_id"], "the request id (trace id) rides on the result")

	res = callTool(t, cl, "file_read", map[string]any{"path": "a.txt"})
	require.True(t, res.IsError)
	require.Equal(t, "invalid_request", structured(t, res)["error"].(map[string]any)["kind"])

	obs := &fakeCaller{}
	ocl := connect(t, mcp.SetObservability, obs, true)
	callTool(t, ocl, "snapshot", map[string]any{})
	require.Equal(t, jsonl.SystemScope(), obs.last().scope, "snapshot without sandbox_id is the fleet form")
	callTool(t, ocl, "snapshot", map[string]any{"sandbox_id": "eos-2"})
	require.Equal(t, jsonl.SandboxScope("eos-2"), obs.last().scope)
	// A sandbox_id that is not a string is refused, not read as the fleet.
	n := len(obs.calls)
	for _, bad := range []any{123, true, []any{"eos-2"}, map[string]any{}} {
		res := callTool(t, ocl, "snapshot", map[string]any{"sandbox_id": bad})
		require.True(t, res.IsError, "%v", bad)
		require.Equal(t, "invalid_request", structured(t, res)["error"].(map[string]any)["kind"])
	}
	require.Len(t, obs.calls, n, "nothing was sent")

	mgr := &fakeCaller{}
	mcl := connect(t, mcp.SetManagement, mgr, false)
	callTool(t, mcl, "destroy_sandbox", map[string]any{"sandbox_id": "eos-3"})
	require.Equal(t, jsonl.SystemScope(), mgr.last().scope)
	require.Equal(t, map[string]any{"sandbox_id": "eos-3"}, mgr.last().args, "management ops keep sandbox_id as their own arg")
}

func TestResultsCarryStructuredAndText(t *testing.T) {
	f := &fakeCaller{answer: func(op string, args map[string]any, _ func(string)) (json.RawMessage, error) {
		switch op {
		case "exec_command":
			return json.RawMessage(`{"status":"ok","exit_code":0,"wall_time_seconds":0.01,"start_offset":0,"end_offset":2,"total_lines":2,"output":"hello\nworld","command_session_id":"c1"}`), nil
		case "file_read":
			return json.RawMessage(`{"path":"a.txt","content":"one\ntwo\n","start_line":1,"num_lines":2,"total_lines":3,"next_offset":3}`), nil
		}
		return json.RawMessage(`{"workspace_session_id":"ws-1","network_profile":"shared","finalize_policy":"no_op"}`), nil
	}}
	for _, legacy := range []bool{false, true} {
		cl := connect(t, mcp.SetRuntime, f, legacy)
		res := callTool(t, cl, "exec_command", map[string]any{"sandbox_id": "eos-1", "cmd": "echo"})
		require.False(t, res.IsError)
		require.Equal(t, "ok", structured(t, res)["status"])
		require.Contains(t, text(res), "status: ok, exit code 0")
		require.Contains(t, text(res), "hello\nworld")

		res = callTool(t, cl, "file_read", map[string]any{"sandbox_id": "eos-1", "path": "a.txt"})
		require.Contains(t, text(res), "a.txt (lines 1-2 of 3)\none\ntwo\n[more: file_read offset 3]")

		res = callTool(t, cl, "create_workspace_session", map[string]any{"sandbox_id": "eos-1"})
		require.Contains(t, text(res), "workspace_session_id: ws-1")
		require.Equal(t, "ws-1", structured(t, res)["workspace_session_id"])
	}
}

func TestErrorsAreToolResults(t *testing.T) {
	conflict := &api.Error{Kind: "operation_failed", Message: "publish rejected", Details: map[string]any{
		"workspace_session_id": "ws-3", "stage": "publish", "session_retained": true,
		"conflicts": []map[string]any{{"path": "shared.txt", "kind": "content", "reason": "source_conflict",
			"hunks": []map[string]any{{"base": map[string]any{"start_line": 2, "line_count": 1}, "head": map[string]any{"start_line": 2, "line_count": 1},
				"ours": map[string]any{"start_line": 2, "line_count": 1}}}}},
	}}
	f := &fakeCaller{answer: func(op string, args map[string]any, _ func(string)) (json.RawMessage, error) {
		return nil, conflict
	}}
	cl := connect(t, mcp.SetRuntime, f, false)
	res := callTool(t, cl, "publish_workspace_session", map[string]any{"sandbox_id": "eos-1", "workspace_session_id": "ws-3"})
	require.True(t, res.IsError)
	env := structured(t, res)["error"].(map[string]any)
	require.Equal(t, "operation_failed", env["kind"])
	require.Equal(t, "shared.txt", env["details"].(map[string]any)["conflicts"].([]any)[0].(map[string]any)["path"])
	txt := text(res)
	require.Contains(t, txt, "publish_workspace_session failed: operation_failed: publish rejected")
	require.Contains(t, txt, "- shared.txt: content")
	require.Contains(t, txt, "base line 2, others published line 2, yours line 2")
	require.Contains(t, txt, "destroy_workspace_session, create_workspace_session")

	// A transport failure is a tool result too.
	f.answer = func(string, map[string]any, func(string)) (json.RawMessage, error) {
		return nil, api.Errorf("connection_error", nil, "connect to gateway 127.0.0.1:1: connection refused")
	}
	res = callTool(t, cl, "file_read", map[string]any{"sandbox_id": "eos-1", "path": "x"})
	require.True(t, res.IsError)
	require.Contains(t, text(res), "connection_error")
}

func TestProgressNotifications(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		f := &fakeCaller{answer: func(op string, args map[string]any, progress func(string)) (json.RawMessage, error) {
			if progress == nil {
				return json.RawMessage(`{"status":"ok"}`), nil
			}
			for i := 0; i < 500; i++ {
				progress("line " + string(rune('a'+i%26)))
			}
			time.Sleep(50 * time.Millisecond)
			progress("last")
			return json.RawMessage(`{"status":"ok","exit_code":0,"output":"done"}`), nil
		}}
		cl := connect(t, mcp.SetRuntime, f, legacy)
		var mu sync.Mutex
		var notes []mcplib.JSONRPCNotification
		cl.OnNotification(func(n mcplib.JSONRPCNotification) {
			mu.Lock()
			defer mu.Unlock()
			if n.Method == string(mcplib.MethodNotificationProgress) {
				notes = append(notes, n)
			}
		})
		req := mcplib.CallToolRequest{}
		req.Params.Name = "exec_command"
		req.Params.Arguments = map[string]any{"sandbox_id": "eos-1", "cmd": "yes | head -500"}
		req.Params.Meta = &mcplib.Meta{ProgressToken: "tok-1"}
		res, err := cl.CallTool(t.Context(), req)
		require.NoError(t, err)
		require.False(t, res.IsError)
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(notes) > 0 && strings.HasSuffix(notes[len(notes)-1].Params.AdditionalFields["message"].(string), "last")
		}, 5*time.Second, 10*time.Millisecond, "the last progress message arrives")
		mu.Lock()
		require.Less(t, len(notes), 50, "500 lines are coalesced into a few notifications")
		var lines int
		prev := 0.0
		for _, n := range notes {
			require.Equal(t, "tok-1", n.Params.AdditionalFields["progressToken"])
			p := asFloat(n.Params.AdditionalFields["progress"])
			require.Greater(t, p, prev, "progress increases")
			prev = p
			lines += strings.Count(n.Params.AdditionalFields["message"].(string), "\n") + 1
		}
		mu.Unlock()
		require.Equal(t, 501, lines, "every line is delivered once")

		// Without a progress token the caller gets no progress sink.
		res = callTool(t, cl, "exec_command", map[string]any{"sandbox_id": "eos-1", "cmd": "true"})
		require.Equal(t, "ok", structured(t, res)["status"])
	}
}

// asFloat reads a JSON number that may not have been through encoding/json
// (the in-process transport hands values over as they were sent).
func asFloat(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int:
		return float64(n)
	case int64:
		return float64(n)
	}
	return -1
}

// Progress over the stdio transport (pipes), as sandbox-mcp serves it.
func TestProgressOverStdio(t *testing.T) {
	f := &fakeCaller{answer: func(op string, args map[string]any, progress func(string)) (json.RawMessage, error) {
		if progress != nil {
			progress("step 1")
			progress("step 2")
		}
		return json.RawMessage(`{"id":"eos-1","state":"ready"}`), nil
	}}
	srv, err := mcp.NewServer(mcp.SetManagement, f, mcp.Options{})
	require.NoError(t, err)
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	go func() { _ = mcpserver.NewStdioServer(srv).Listen(t.Context(), sr, sw) }()
	cl := mcpclient.NewClient(transport.NewIO(cr, cw, io.NopCloser(strings.NewReader(""))))
	require.NoError(t, cl.Start(t.Context()))
	var mu sync.Mutex
	var msgs []string
	cl.OnNotification(func(n mcplib.JSONRPCNotification) {
		mu.Lock()
		defer mu.Unlock()
		if n.Method == string(mcplib.MethodNotificationProgress) {
			msgs = append(msgs, n.Params.AdditionalFields["message"].(string))
		}
	})
	req := mcplib.InitializeRequest{}
	req.Params.ProtocolVersion = mcplib.ProtocolVersion20250618
	_, err = cl.Initialize(t.Context(), req)
	require.NoError(t, err)
	call := mcplib.CallToolRequest{}
	call.Params.Name = "create_sandbox"
	call.Params.Arguments = map[string]any{"image": "x", "workspace_root": "/tmp"}
	call.Params.Meta = &mcplib.Meta{ProgressToken: 7}
	res, err := cl.CallTool(t.Context(), call)
	require.NoError(t, err)
	require.False(t, res.IsError, text(res))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(msgs, "\n"), "step 2")
	}, 5*time.Second, 10*time.Millisecond)
}

// A verified publish on MCP: the runtime tool declares verify and its
// bounds (from the catalog) and passes them to the gateway as given.
func TestVerifiedPublishTool(t *testing.T) {
	op, ok := api.LookupOp("publish_workspace_session")
	require.True(t, ok)
	props := mcp.InputSchema(mcp.SetRuntime, op)["properties"].(map[string]any)
	require.Equal(t, "string", props["verify"].(map[string]any)["type"])
	require.EqualValues(t, 1, props["verify_timeout_s"].(map[string]any)["minimum"])
	require.EqualValues(t, api.MaxVerifyTimeoutS, props["verify_timeout_s"].(map[string]any)["maximum"])
	require.EqualValues(t, api.MaxVerifyRetries, props["verify_retries"].(map[string]any)["maximum"])
	f := &fakeCaller{}
	cl := connect(t, mcp.SetRuntime, f, false)
	res := callTool(t, cl, "publish_workspace_session", map[string]any{"sandbox_id": "eos-1", "workspace_session_id": "ws-1",
		"verify": "make test", "verify_timeout_s": 30, "verify_retries": 1})
	require.False(t, res.IsError, text(res))
	require.Equal(t, "publish_workspace_session", f.last().op)
	require.Equal(t, "make test", f.last().args["verify"])
	require.EqualValues(t, 30, f.last().args["verify_timeout_s"])
}
