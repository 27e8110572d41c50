package mcp

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	mcplib "github.com/mark3labs/mcp-go/mcp"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// The tool sets, one per server process (the seed's --set values).
const (
	SetManagement    = api.GroupManagement
	SetRuntime       = api.GroupRuntime
	SetObservability = api.GroupObservability
)

// Sets lists the tool sets in the order the seed documents them.
func Sets() []string { return []string{SetManagement, SetRuntime, SetObservability} }

// ValidSet reports whether set names a tool set.
func ValidSet(set string) bool {
	for _, s := range Sets() {
		if s == set {
			return true
		}
	}
	return false
}

// ServerName returns the name a client registers the set's server under
// (the seed's setup-codex-mcp names).
func ServerName(set string) string { return "ephemeral-os-" + set }

const argSandboxID = "sandbox_id"

// sandboxIDProp is the sandbox_id property the runtime and observability
// sets add to operations whose scope is a sandbox.
var sandboxIDProp = map[string]any{"type": "string", "minLength": 1,
	"description": "Id of the sandbox (eos-<uuid>) from create_sandbox or list_sandboxes."}

// sandboxArg reports how a tool of set takes sandbox_id for op: "" (not at
// all, or as the op's own argument), "required" or "optional".
func sandboxArg(set string, op *api.Operation) string {
	if _, own := op.Arg(argSandboxID); own {
		return ""
	}
	switch {
	case set == SetRuntime, op.Scope == api.ScopeSandbox:
		return "required"
	case op.Scope == api.ScopeEither:
		return "optional"
	}
	return ""
}

// InputSchema is the tool's input schema: the catalog's args schema
// (required, defaults, limits, enums, additionalProperties false), integers
// at least 0 unless the catalog says more, and sandbox_id where the set
// routes by it.
func InputSchema(set string, op *api.Operation) map[string]any {
	s := op.ArgsSchema()
	props := s["properties"].(map[string]any)
	for _, a := range op.Args {
		if a.Type == api.TypeInt && a.Min == nil {
			props[a.Name].(map[string]any)["minimum"] = 0
		}
	}
	switch sandboxArg(set, op) {
	case "required":
		props[argSandboxID] = sandboxIDProp
		req, _ := s["required"].([]string)
		s["required"] = append([]string{argSandboxID}, req...)
	case "optional":
		p := map[string]any{}
		for k, v := range sandboxIDProp {
			p[k] = v
		}
		p["description"] = "Id of one sandbox (eos-<uuid>); leave it out for the whole fleet."
		props[argSandboxID] = p
	}
	return s
}

// Tool renders the catalog operation as an MCP tool of set.
func Tool(set string, op *api.Operation) mcplib.Tool {
	schema, err := json.Marshal(InputSchema(set, op))
	if err != nil {
		panic(fmt.Sprintf("mcp: schema of %s: %v", op.Name, err)) // catalog values are plain JSON
	}
	h := op.Hints()
	t := mcplib.NewToolWithRawSchema(op.Name, description(set, op), schema)
	t.Title = title(op.Name)
	t.Annotations = mcplib.ToolAnnotation{
		Title:           t.Title,
		ReadOnlyHint:    mcplib.ToBoolPtr(h.ReadOnly),
		DestructiveHint: mcplib.ToBoolPtr(!h.ReadOnly && h.Destructive),
		IdempotentHint:  mcplib.ToBoolPtr(h.Idempotent),
		// Sandboxes are closed worlds: the tools act on the sandbox and,
		// for create and export, on the host paths they are given.
		OpenWorldHint: mcplib.ToBoolPtr(false),
	}
	return t
}

// Tools returns the tools of a set, in catalog order.
func Tools(set string) []mcplib.Tool {
	ops := api.PublicOps(set)
	out := make([]mcplib.Tool, 0, len(ops))
	for i := range ops {
		out = append(out, Tool(set, &ops[i]))
	}
	return out
}

// description is the catalog's description, written for a model, plus what
// the result holds and how the tool is routed.
func description(set string, op *api.Operation) string {
	var b strings.Builder
	b.WriteString(op.Summary)
	if op.Description != "" && op.Description != op.Summary {
		b.WriteString(" " + op.Description)
	}
	if len(op.Result) > 0 {
		keys := make([]string, 0, len(op.Result))
		for k := range op.Result {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(" Returns {" + strings.Join(keys, ", ") + "}.")
	}
	if op.Scope == api.ScopeEither && sandboxArg(set, op) == "optional" {
		b.WriteString(" Without sandbox_id it covers every sandbox.")
	}
	if _, ok := op.Arg("async"); ok {
		b.WriteString(" With async it returns the workflow id at once instead of waiting.")
	}
	return b.String()
}

// title turns exec_command into "Exec command".
func title(name string) string {
	s := strings.ReplaceAll(name, "_", " ")
	return strings.ToUpper(s[:1]) + s[1:]
}
