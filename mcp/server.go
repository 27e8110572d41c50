package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	mcplib "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// Version is the server version reported to clients.
const Version = "0.1.0"

// Caller runs one gateway operation. progress, when not nil, receives the
// gateway's progress messages before the result. *client.Client is a
// Caller (stdio servers talk to a gateway); the gateway serves its own MCP
// endpoint with an in-process Caller.
type Caller interface {
	CallProgress(ctx context.Context, op string, scope jsonl.Scope, args map[string]any, requestID string, progress func(msg string)) (json.RawMessage, error)
}

// Options tune a server.
type Options struct {
	Log *slog.Logger
	// ProgressInterval coalesces progress messages: at most one
	// notification per interval (default 100 ms).
	ProgressInterval time.Duration
}

// NewServer builds the MCP server of one tool set.
func NewServer(set string, caller Caller, o Options) (*mcpserver.MCPServer, error) {
	if !ValidSet(set) {
		return nil, fmt.Errorf("unknown tool set %q (want management, runtime or observability)", set)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 100 * time.Millisecond
	}
	s := mcpserver.NewMCPServer("sandbox-mcp", Version,
		mcpserver.WithTitle("Ephemeral Sandbox MCP ("+set+")"),
		mcpserver.WithToolCapabilities(false),
		mcpserver.WithInstructions(instructions[set]),
		mcpserver.WithRecovery())
	h := &handlers{set: set, caller: caller, o: o}
	ops := api.PublicOps(set)
	for i := range ops {
		op := &ops[i]
		s.AddTool(Tool(set, op), h.handler(op))
	}
	return s, nil
}

type handlers struct {
	set    string
	caller Caller
	o      Options
}

// handler routes one tool call to the gateway: sandbox_id becomes the
// scope where the set routes by it, everything else is the op's args.
func (h *handlers) handler(op *api.Operation) mcpserver.ToolHandlerFunc {
	how := sandboxArg(h.set, op)
	return func(ctx context.Context, req mcplib.CallToolRequest) (*mcplib.CallToolResult, error) {
		args := map[string]any{}
		for k, v := range req.GetArguments() {
			args[k] = v
		}
		scope := jsonl.SystemScope()
		if how != "" {
			v, given := args[argSandboxID]
			id, isString := v.(string)
			if given && !isString {
				// Not read as "no sandbox": that would widen the scope.
				return errorResult(op.Name, "", api.Errorf(api.KindInvalidRequest, map[string]any{"op": op.Name, "arg": argSandboxID},
					"%s: sandbox_id must be a string", argSandboxID)), nil
			}
			delete(args, argSandboxID)
			switch {
			case id != "":
				scope = jsonl.SandboxScope(id)
			case how == "required":
				return errorResult(op.Name, "", api.Errorf(api.KindInvalidRequest, map[string]any{"arg": argSandboxID},
					"%s requires sandbox_id", op.Name)), nil
			}
		}
		rid := client.NewRequestID()
		p := newProgress(ctx, req, h.o.ProgressInterval)
		start := time.Now()
		raw, err := h.caller.CallProgress(ctx, op.Name, scope, args, rid, p.sink())
		p.close()
		h.o.Log.Info("tool", "set", h.set, "tool", op.Name, "request_id", rid, "ms", time.Since(start).Milliseconds(), "err", err)
		if err != nil {
			return errorResult(op.Name, rid, err), nil
		}
		return okResult(op.Name, rid, raw), nil
	}
}

func withRequestID(r *mcplib.CallToolResult, rid string) *mcplib.CallToolResult {
	if rid != "" {
		r.Meta = mcplib.NewMetaFromMap(map[string]any{"request_id": rid})
	}
	return r
}

// okResult carries the gateway's JSON as structured content and as text.
func okResult(op, rid string, raw json.RawMessage) *mcplib.CallToolResult {
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		return errorResult(op, rid, api.Errorf(api.KindInternal, nil, "gateway answer is not a JSON object: %v", err))
	}
	return withRequestID(&mcplib.CallToolResult{
		Content:           []mcplib.Content{mcplib.NewTextContent(RenderResult(op, v))},
		StructuredContent: v,
	}, rid)
}

// errorResult is a failed call as a tool result the model can read.
func errorResult(op, rid string, err error) *mcplib.CallToolResult {
	e := *api.AsError(err)
	// Plain JSON values (details built in-process may hold typed slices),
	// so the rendering and the structured content agree.
	details := map[string]any{}
	if b, merr := json.Marshal(e.Details); merr == nil {
		_ = json.Unmarshal(b, &details)
	}
	e.Details = details
	env := map[string]any{"error": map[string]any{"kind": e.Kind, "message": e.Message, "details": e.Details}}
	return withRequestID(&mcplib.CallToolResult{
		Content:           []mcplib.Content{mcplib.NewTextContent(RenderError(op, &e))},
		StructuredContent: env,
		IsError:           true,
	}, rid)
}

// instructions tell a model how the set's tools fit together.
var instructions = map[string]string{
	SetManagement: "Manage Ephemeral Sandbox sandboxes: one Docker container per project in which many agents work at once. " +
		"create_sandbox imports a host directory (workspace_root) as the base; list_sandboxes and inspect_sandbox show them; " +
		"export_changes writes everything published back to the host; destroy_sandbox removes a sandbox and everything unexported.",
	SetRuntime: "Work inside a sandbox (every tool takes sandbox_id). Typical loop: create_workspace_session (your private " +
		"copy-on-write view of /workspace), then exec_command, file_read, file_write and file_edit with its workspace_session_id, " +
		"then publish_workspace_session. Publishing merges your changes with what other agents published since your session " +
		"started; if another agent changed the same lines, nothing is committed and the error lists each conflicting path " +
		"(details.conflicts: kind, line ranges). Then destroy_workspace_session, start a new session (it sees the latest " +
		"published state), redo your change on top and publish again. Without workspace_session_id, file writes publish at once " +
		"and exec_command runs in a one-off session that publishes when the command ends. A command still running returns " +
		"status \"running\" and a command_session_id: poll it with read_command_lines or write_command_stdin.",
	SetObservability: "Read-only views of sandboxes: snapshot (without sandbox_id, the whole fleet; a sandbox that does not " +
		"answer shows as unavailable), events, trace (the request id of any call, in each result's _meta.request_id, is its " +
		"trace id), resources (without sandbox_id, the fleet), cgroup, topology, daemon, layerstack, publish_history (who " +
		"published what and when, merged or conflicting) and workflows (the Temporal workflows behind a sandbox, with links " +
		"into the Temporal UI).",
}
