package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcplib "github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// refusal is one request that must be refused, and what every door must
// answer for it.
type refusal struct {
	name    string
	op      string
	sandbox string         // "" = system scope
	args    map[string]any // the op's arguments
	kind    string
	message string // a substring of the message
	details []string
}

// TestRefusalsReachEveryDoorIntact: a refusal raised anywhere below the
// gateway (the daemon on a runtime op, the daemon inside a publish
// workflow, a workflow's validator, an activity, the gateway itself)
// reaches the client through HTTP, JSON lines, the CLIs and MCP with the
// same kind, message and details, and none of Temporal's, Docker's or the
// daemon's internals.
func TestRefusalsReachEveryDoorIntact(t *testing.T) {
	g, id, ws := gatewayWithSandbox(t, "one\ntwo\nthree\n")
	rt := func(argv ...string) map[string]any {
		t.Helper()
		return mustCLI(t, g, "sandbox-runtime-cli", append([]string{"--sandbox-id", id}, argv...)...)
	}

	// A session with a command still running: its publish is refused at
	// the prepare step, inside the publish workflow.
	busy := rt("create_workspace_session")["workspace_session_id"].(string)
	run := rt("exec_command", "--workspace-session-id", busy, "--yield-time-ms", "200", "sleep 120")
	require.Equal(t, "running", run["status"], "%v", run)

	// Two sessions change the same line: the second publish conflicts.
	a := rt("create_workspace_session")["workspace_session_id"].(string)
	b := rt("create_workspace_session")["workspace_session_id"].(string)
	rt("file_write", "--workspace-session-id", a, "--path", "f.txt", "--content", "one\nTWO-a\nthree\n")
	rt("file_write", "--workspace-session-id", b, "--path", "f.txt", "--content", "one\nTWO-b\nthree\n")
	rt("publish_workspace_session", "--workspace-session-id", a)

	cases := []refusal{
		{name: "daemon refusal on a runtime op", op: "file_read", sandbox: id, args: map[string]any{"path": "missing.txt"},
			kind: api.KindNotFound, message: "file not found"},
		{name: "daemon refusal inside the publish workflow", op: "publish_workspace_session", sandbox: id,
			args: map[string]any{"workspace_session_id": busy}, kind: api.KindOperationFailed, message: "running command",
			details: []string{"workspace_session_id", "active_command_session_ids"}},
		{name: "conflict found by the publish workflow", op: "publish_workspace_session", sandbox: id,
			args: map[string]any{"workspace_session_id": b}, kind: api.KindOperationFailed, message: "publish rejected",
			details: []string{"conflicts", "publish_rejection", "session_retained"}},
		{name: "workflow validator", op: "publish_workspace_session", sandbox: id,
			args: map[string]any{"workspace_session_id": "ws-nope"}, kind: api.KindNotFound, message: "workspace session not found: ws-nope"},
		{name: "activity refusal", op: "create_sandbox", args: map[string]any{"image": "eos-no-such-image:404", "workspace_root": ws},
			kind: api.KindInvalidRequest, message: "is not present on this Docker host"},
		{name: "unknown sandbox", op: "inspect_sandbox", args: map[string]any{"sandbox_id": "eos-nope"},
			kind: api.KindInvalidRequest, message: "sandbox not found: eos-nope"},
		{name: "fork of an unknown session", op: "create_workspace_session", sandbox: id, args: map[string]any{"from": "ws-nope"},
			kind: api.KindNotFound, message: "workspace session not found: ws-nope"},
		{name: "binary upload escaping the workspace", op: "file_upload", sandbox: id,
			args: map[string]any{"path": "../x.bin", "content_base64": "AAEC", "workspace_session_id": a}, kind: api.KindInvalidRequest, message: "invalid path"},
		{name: "git export where there is no repository", op: "export_changes",
			args: map[string]any{"sandbox_id": id, "dest": ws, "format": "git", "branch": "eos/x"}, kind: api.KindInvalidRequest, message: "not inside a git working tree"},
	}
	mcpClients := map[string]*mcpclient.Client{}
	for _, set := range []string{"management", "runtime"} {
		cl, err := mcpclient.NewStreamableHttpClient("http://"+g.Addr+"/mcp/"+set,
			transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + g.Token}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		require.NoError(t, cl.Start(t.Context()))
		init := mcplib.InitializeRequest{}
		init.Params.ClientInfo = mcplib.Implementation{Name: "refusals", Version: "1"}
		init.Params.ProtocolVersion = mcplib.ProtocolVersion20250618
		_, err = cl.Initialize(t.Context(), init)
		require.NoError(t, err)
		mcpClients[set] = cl
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doors := map[string]*api.Error{
				"http":       viaHTTP(t, g, c),
				"json_lines": viaJSONLines(t, g, c),
				"cli":        viaCLI(t, g, c),
				"mcp":        viaMCP(t, mcpClients, c),
			}
			first := doors["http"]
			if c.kind != "" {
				require.Equal(t, c.kind, first.Kind, "%+v", first)
			}
			require.Contains(t, first.Message, c.message)
			for _, k := range c.details {
				require.Contains(t, first.Details, k, "%+v", first)
			}
			for door, e := range doors {
				require.Equal(t, first.Kind, e.Kind, "%s: kind", door)
				require.Equal(t, first.Message, e.Message, "%s: message", door)
				require.True(t, reflect.DeepEqual(normalize(first.Details), normalize(e.Details)), "%s: details\n http %v\n %s %v", door, first.Details, door, e.Details)
				text := e.Message + " " + mustJSON(e.Details)
				for _, internal := range []string{"wrapError", "activity error", "ActivityError", "workflow execution", "WorkflowExecution",
					"/eos/", "eos-sbx-", "eos-state-", "DaemonError", "(type:", "retryable"} {
					require.NotContains(t, text, internal, "%s leaks an internal: %s", door, text)
				}
				require.NotContains(t, e.Details, "type", "%s: details carry Temporal's error type", door)
			}
		})
	}
	// The busy session still runs its command and keeps its work: the
	// refused publish changed nothing.
	lst := rt("exec_command", "--workspace-session-id", busy, "--yield-time-ms", "100", "true")
	require.NotEqual(t, "error", lst["status"], "%v", lst)
}

func scopeOf(c refusal) map[string]any {
	if c.sandbox == "" {
		return map[string]any{"kind": "system"}
	}
	return map[string]any{"kind": "sandbox", "sandbox_id": c.sandbox}
}

func envelope(t *testing.T, door string, b []byte) *api.Error {
	t.Helper()
	var env api.Envelope
	require.NoError(t, json.Unmarshal(b, &env), "%s: %s", door, b)
	require.NotNil(t, env.Error, "%s answered no error: %s", door, b)
	return env.Error
}

func viaHTTP(t *testing.T, g *gatewayProc, c refusal) *api.Error {
	t.Helper()
	st, b, err := g.HTTPOp(c.op, map[string]any{"scope": scopeOf(c), "args": c.args, "request_id": "http-" + client.NewRequestID()[:12]})
	require.NoError(t, err)
	require.Equal(t, api.HTTPStatus(envelope(t, "http", b).Kind), st)
	return envelope(t, "http", b)
}

func viaJSONLines(t *testing.T, g *gatewayProc, c refusal) *api.Error {
	t.Helper()
	line, err := testenv.RawLine(g.Addr, map[string]any{"op": c.op, "request_id": "jl-" + client.NewRequestID()[:12], "scope": scopeOf(c),
		"args": c.args, "_sandbox_gateway_auth_token": g.Token})
	require.NoError(t, err)
	return envelope(t, "json_lines", line)
}

func viaCLI(t *testing.T, g *gatewayProc, c refusal) *api.Error {
	t.Helper()
	op, _ := api.LookupOp(c.op)
	bin := map[string]string{api.GroupManagement: mgr, api.GroupRuntime: "sandbox-runtime-cli"}[op.Group]
	var argv []string
	if c.sandbox != "" {
		argv = append(argv, "--sandbox-id", c.sandbox)
	}
	argv = append(argv, c.op)
	for k, v := range c.args {
		argv = append(argv, "--"+strings.ReplaceAll(k, "_", "-"), fmt.Sprint(v))
	}
	r := runCLI(t, g, bin, argv...)
	require.Equal(t, 1, r.code, "%s: %s", bin, r.stderr)
	b, _ := json.Marshal(map[string]any{"error": r.errEnv})
	return envelope(t, "cli", b)
}

func viaMCP(t *testing.T, clients map[string]*mcpclient.Client, c refusal) *api.Error {
	t.Helper()
	op, _ := api.LookupOp(c.op)
	args := map[string]any{}
	for k, v := range c.args {
		args[k] = v
	}
	if c.sandbox != "" {
		args["sandbox_id"] = c.sandbox
	}
	req := mcplib.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = c.op, args
	res, err := clients[op.Group].CallTool(t.Context(), req)
	require.NoError(t, err, "refusals are tool results, not protocol errors")
	require.True(t, res.IsError)
	b, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	return envelope(t, "mcp", b)
}

// normalize makes details comparable across doors: JSON numbers, and no
// transaction id (each door's publish is a publish of its own).
func normalize(d map[string]any) map[string]any {
	out := map[string]any{}
	b, err := json.Marshal(d)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		return map[string]any{"undecodable": err.Error()}
	}
	delete(out, "txid")
	return out
}
