package api

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Operation groups (the seed's three CLI families).
const (
	GroupManagement    = "management"
	GroupRuntime       = "runtime"
	GroupObservability = "observability"
	GroupInternal      = "internal"
)

// Scopes an operation accepts.
const (
	ScopeSystem  = "system"  // system scope only
	ScopeSandbox = "sandbox" // sandbox scope only
	ScopeEither  = "either"  // system (fleet form) or sandbox
)

// Arg types.
const (
	TypeString = "string"
	TypeInt    = "int"
	TypeBool   = "bool"
	TypeObject = "object"
	TypeArray  = "array"
	// TypeStringOrList is one of the Enum strings or an array of strings
	// (egress: "none", "default" or ["cidr:port", ...]).
	TypeStringOrList = "string_or_list"
)

// Arg is one typed argument of an operation.
type Arg struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`
	Required bool     `json:"required,omitempty"`
	Default  any      `json:"default,omitempty"`
	Min      *int64   `json:"min,omitempty"`
	Max      *int64   `json:"max,omitempty"`
	Enum     []string `json:"enum,omitempty"`
	// Pattern is a regular expression a string must match (ids, which also
	// end up in Temporal visibility queries and paths).
	Pattern     string   `json:"pattern,omitempty"`
	Positional  bool     `json:"positional,omitempty"` // the CLI's trailing positional argument
	Aliases     []string `json:"aliases,omitempty"`    // extra CLI flag names (kebab-case)
	Description string   `json:"description"`
	// Schema holds extra JSON Schema keywords describing the inside of an
	// object or array arg (items, properties), for OpenAPI and MCP.
	Schema map[string]any `json:"schema,omitempty"`
}

// Operation is one entry of the catalog: the single declaration that drives
// HTTP routes, JSON-lines dispatch, CLI commands, help and OpenAPI.
type Operation struct {
	Name        string `json:"name"`
	Group       string `json:"group"`
	Summary     string `json:"summary"`
	Description string `json:"description"`
	Args        []Arg  `json:"args"`
	// Result lists the result's top-level fields and their JSON types.
	Result map[string]string `json:"result,omitempty"`
	// Lifecycle ops go through Temporal; the others go straight to the
	// sandbox daemon. Route says how a lifecycle op is served.
	Lifecycle bool  `json:"lifecycle,omitempty"`
	Route     Route `json:"route,omitempty"`
	// Progress ops report progress while they run when the caller asks
	// (_stream_logs, Accept: text/event-stream, an MCP progress token).
	Progress bool `json:"progress,omitempty"`
	// AmendWhenSessionless: without workspace_session_id the op is a
	// lifecycle op (the workflow's amend update); with one, a runtime op.
	AmendWhenSessionless bool `json:"amend_when_sessionless,omitempty"`
	// Internal ops are driven by the workflow layer and refused at every
	// public door.
	Internal bool   `json:"internal,omitempty"`
	Scope    string `json:"scope"`
	// CLIUpload names a base64 arg the CLIs fill from a local file
	// (--from LOCALFILE); CLIDownload a base64 result field they write to
	// one (--to LOCALFILE, --force to overwrite). Other doors send the arg.
	CLIUpload   string `json:"cli_upload,omitempty"`
	CLIDownload string `json:"cli_download,omitempty"`
	// RawHTTP is the method (PUT or GET) under which the op is also served
	// as raw bytes at FilesPath: the body is CLIUpload's bytes, or the
	// answer is CLIDownload's; the other args are query parameters.
	RawHTTP string `json:"raw_http,omitempty"`
}

// FilesPath is the raw-bytes route of the ops with RawHTTP.
const FilesPath = "/v1/sandboxes/{sandbox_id}/files"

// Route is how the gateway serves a lifecycle operation.
type Route string

const (
	// RouteUpdate (the default of a lifecycle op): the sandbox workflow's
	// update named like the operation; a sessionless file op is its amend
	// update.
	RouteUpdate Route = ""
	// RouteRecords: answered by the gateway from the sandbox workflows
	// (start, state, visibility): create, inspect, list, destroy, the
	// workflows view.
	RouteRecords Route = "records"
	// RouteHost: a read of a Docker host, run as an activity on the
	// host's worker.
	RouteHost Route = "host"
)

// IsLifecycle reports whether a call with these args goes through Temporal.
func (o *Operation) IsLifecycle(args map[string]any) bool {
	if o.AmendWhenSessionless {
		ws, _ := args["workspace_session_id"].(string)
		return ws == ""
	}
	return o.Lifecycle
}

// Arg returns the named argument.
func (o *Operation) Arg(name string) (Arg, bool) {
	for _, a := range o.Args {
		if a.Name == name {
			return a, true
		}
	}
	return Arg{}, false
}

// PositionalArg returns the argument marked Positional.
func (o *Operation) PositionalArg() (Arg, bool) {
	for _, a := range o.Args {
		if a.Positional {
			return a, true
		}
	}
	return Arg{}, false
}

func i64(v int64) *int64 { return &v }

// Patterns of the ids clients pass back: sandboxes, sessions, commands
// (PatternID) and Temporal workflow and update ids (PatternWorkflowID).
const (
	PatternID         = `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`
	PatternWorkflowID = `^[A-Za-z0-9][A-Za-z0-9._:/-]{0,255}$`
	PatternHost       = `^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`
)

var patterns sync.Map // pattern -> *regexp.Regexp

func patternOf(p string) *regexp.Regexp {
	if re, ok := patterns.Load(p); ok {
		return re.(*regexp.Regexp)
	}
	re := regexp.MustCompile(p)
	patterns.Store(p, re)
	return re
}

func idArg(a Arg) Arg { a.Pattern = PatternID; return a }

func truncateArg(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func str(name, desc string) Arg { return Arg{Name: name, Type: TypeString, Description: desc} }
func reqStr(name, desc string) Arg {
	return Arg{Name: name, Type: TypeString, Required: true, Description: desc}
}
func intArg(name string, def any, min, max *int64, desc string) Arg {
	return Arg{Name: name, Type: TypeInt, Default: def, Min: min, Max: max, Description: desc}
}
func boolArg(name, desc string) Arg {
	return Arg{Name: name, Type: TypeBool, Default: false, Description: desc}
}

var (
	// argHost names a Docker host of a cluster (its worker's --host-name).
	// argOrphanHost narrows an orphan operation to one Docker host.
	argOrphanHost = Arg{Name: "host", Type: TypeString, Pattern: PatternHost, Description: "Docker host to look on, by its worker's --host-name (a cluster; default: every live host, and the gateway's own)."}
	argHost       = Arg{Name: "host", Type: TypeString, Pattern: PatternHost, Description: "Docker host to run on, by its worker's --host-name (a cluster; default: the least-loaded live host, or the gateway's own)."}
	argSandboxID  = Arg{Name: "sandbox_id", Type: TypeString, Required: true, Pattern: PatternID, Description: "Id of the sandbox (eos-<uuid>)."}
	argWS         = idArg(str("workspace_session_id", "Workspace session to run in. Without it, file changes publish at once and commands run in an implicit session that publishes when its last command ends."))
	argWSReq      = idArg(reqStr("workspace_session_id", "Workspace session id returned by create_workspace_session."))
	argWorkflowID = Arg{Name: "workflow_id", Type: TypeString, Required: true, Pattern: PatternWorkflowID,
		Description: "A workflow id (sandbox/<id>, publish/<sandbox>/<session>/<n>, ...), as list_workflows or an --async answer gives it."}
	argCmdID  = idArg(reqStr("command_session_id", "Command session id returned by exec_command while the command was running."))
	argGrace  = intArg("grace_s", nil, i64(0), i64(3600), "Seconds to wait for running commands to end before refusing.")
	argYield  = intArg("yield_time_ms", int64(DefaultYieldTimeMS), i64(0), i64(MaxYieldTimeMS), "How long to wait for output before returning; the command keeps running.")
	argWindow = intArg("window_ms", int64(60000), i64(1), i64(600000), "Length of the sampled window in milliseconds.")
)

// Schemas of the structured args.
var (
	editsSchema = map[string]any{"minItems": 1, "items": map[string]any{
		"type": "object", "additionalProperties": false, "required": []string{"old_string", "new_string"},
		"properties": map[string]any{
			"old_string":  map[string]any{"type": "string", "description": "Exact text to replace; must occur exactly once unless replace_all."},
			"new_string":  map[string]any{"type": "string", "description": "Replacement text."},
			"replace_all": map[string]any{"type": "boolean", "default": false, "description": "Replace every occurrence."},
		}}}
	envSchema    = map[string]any{"additionalProperties": map[string]any{"type": "string"}}
	limitsSchema = map[string]any{"additionalProperties": false, "properties": map[string]any{
		// The daemon's bounds (sandboxinit/runtime, Limits.Check), enforced
		// here too (Arg.checkProperties) so a bad value never reaches it.
		"pids_max":     map[string]any{"type": "integer", "minimum": 1, "maximum": 4 << 20, "description": "Maximum number of processes (at most 4194304, the kernel's PID_MAX_LIMIT)."},
		"memory_bytes": map[string]any{"type": "integer", "minimum": 8 << 20, "description": "Memory limit in bytes (at least 8 MiB)."},
		"cpus":         map[string]any{"type": "number", "exclusiveMinimum": 0, "maximum": 1024, "description": "CPU quota in cores, e.g. 0.5 (at most 1024)."},
	}}
)

var resCommand = map[string]string{
	"status": "string", "exit_code": "integer|null", "wall_time_seconds": "number",
	"command_total_time_seconds": "number", "start_offset": "integer", "end_offset": "integer",
	"total_lines": "integer", "original_token_count": "integer", "output": "string",
	"command_session_id": "string", "workspace_session_id": "string",
	"publish_rejected": "boolean", "publish_reject_class": "string", "publish_conflicts": "array", "publish": "object", "output_dropped": "string",
}

var resSandbox = map[string]string{
	"id": "string", "workspace_root": "string", "state": "string", "daemon": "object",
	"daemon_http": "object", "shared_base": "object|null", "activity_revision": "integer",
}

// catalog is the operation table. Names, args and result fields follow the
// seed contract (shared/reference/seed-contract.md §0.2–0.3).
var catalog = []Operation{
	// --- management (system scope) ---
	{Name: "create_sandbox", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords, Progress: true,
		Summary:     "Create a sandbox from a Docker image and a host workspace directory.",
		Description: "Starts a sandbox container from image, imports workspace_root (an absolute host path) as the base layer, and waits until the sandbox is ready. Returns the sandbox record; use its id as sandbox_id / --sandbox-id for runtime operations. With count > 1 returns {sandboxes:[...]}.",
		Args: []Arg{
			reqStr("image", "Docker image already on the host (nothing is pulled; list_docker_images lists them), e.g. ubuntu:24.04."),
			{Name: "workspace_root", Type: TypeString, Required: true, Aliases: []string{"workspace-bind-root"}, Description: "Absolute host path imported as the sandbox's /workspace base: inside an allowed root of the gateway (--allow-root; default its user's home and start directory), with no symlink component, never /, a system directory or the gateway's state dir."},
			intArg("count", int64(1), i64(1), i64(16), "How many identical sandboxes to create."),
			str("ttl", "Pause the sandbox this long after it was created or last resumed, e.g. 24h (Go duration, 1s to 8784h; 0 = never; default the gateway's --default-sandbox-ttl). Pausing keeps every volume; resume_sandbox brings it back."),
			str("session_idle_ttl", "Archive a workspace session unused for this long, e.g. 30m (Go duration, 1s to 8784h; 0 = never; default the gateway's --default-session-idle-ttl). Its unpublished work is kept: list_archived_sessions, restore_workspace_session."),
			argHost,
		},
		Result: resSandbox},
	{Name: "pause_sandbox", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true,
		Summary:     "Stop a sandbox's container, keeping every volume.",
		Description: "Stops the container (its CPU and memory are freed; running commands end) and keeps the state volume: published layers and every session with its unpublished work. Runtime operations on a paused sandbox are refused with failed_precondition until resume_sandbox. Refused with operation_conflict while a publish runs (details.publishing names the sessions); waits for a running refresh, squash or sessionless file change. Pausing a paused sandbox succeeds and says so (already: true). A sandbox past its ttl is paused the same way.",
		Args:        []Arg{argSandboxID},
		Result:      map[string]string{"sandbox_id": "string", "state": "string", "already": "boolean", "paused_at": "string", "paused_by": "string"}},
	{Name: "resume_sandbox", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true,
		Summary:     "Start a paused sandbox again, with its sessions and their work.",
		Description: "Starts the container, waits for its daemon, records where it listens now, and the daemon brings every session back over its kept upper dir (unpublished work intact). Resuming a running sandbox succeeds and says so (already: true). A ttl counts again from the resume.",
		Args:        []Arg{argSandboxID},
		Result:      map[string]string{"sandbox_id": "string", "state": "string", "already": "boolean", "daemon": "object", "workspace_sessions": "array", "expires_at": "string"}},
	{Name: "list_sandboxes", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "List all sandboxes.",
		Description: "Returns {sandboxes:[record...]} with every known sandbox and its state.",
		Result:      map[string]string{"sandboxes": "array"}},
	{Name: "inspect_sandbox", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "Show one sandbox record.",
		Description: "Returns the sandbox record (state, daemon endpoints, shared base). Unknown ids give invalid_request \"sandbox not found\".",
		Args:        []Arg{argSandboxID}, Result: resSandbox},
	{Name: "destroy_sandbox", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "Destroy a sandbox and its volumes.",
		Description: "Stops the daemon, removes the container and its volumes. Unpublished session changes are lost; export_changes first to keep published work. Returns the final record with state \"stopped\".",
		Args:        []Arg{argSandboxID}, Result: resSandbox},
	{Name: "list_orphaned_sandboxes", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "List sandboxes whose workflow is gone, with their kept work.",
		Description: "A sandbox whose Docker objects exist on a host but whose workflow this deployment no longer runs (another HOME, state dir, namespace or Temporal address at start, a lost Temporal database, a terminated workflow) is an orphan: its container is stopped, its state volume — published and unpublished work — is kept, never deleted by inference. Each entry has the sandbox id, container state, volume and its size in bytes, age, image, workspace root, and the Temporal cluster and namespace that made it (owned_by_this_deployment says whether they are this gateway's) and, in a cluster, the host it is on (without host, every live host is asked). Adopt one with adopt_orphaned_sandbox, or delete it with delete_orphaned_sandbox.",
		Args:        []Arg{argOrphanHost}, Result: map[string]string{"orphans": "array"}},
	{Name: "adopt_orphaned_sandbox", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "Give an orphaned sandbox a workflow again, with its work.",
		Description: "Recreates the sandbox workflow of an orphan over its existing state volume: the container gets this deployment's daemon binary and token and starts, the layer stack and every session (with its unpublished changes) come back as they were. No workspace is copied. Returns the sandbox record.",
		Args:        []Arg{argSandboxID, str("image", "Image to run the sandbox with (default: the orphan's own)."), argOrphanHost}, Result: resSandbox},
	{Name: "delete_orphaned_sandbox", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "Delete an orphaned sandbox's container and state volume.",
		Description: "Removes the container and the state volume of an orphan — its published and unpublished work is gone. Refused for a sandbox whose workflow runs (use destroy_sandbox). Requires confirm: true.",
		Args:        []Arg{argSandboxID, {Name: "confirm", Type: TypeBool, Required: true, Description: "Must be true: the orphan's work is deleted."}, argOrphanHost},
		Result:      map[string]string{"sandbox_id": "string", "deleted": "bool"}},
	{Name: "list_workflows", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "List the product's Temporal workflows.",
		Description: "Newest first: sandbox workflows, their publishes and host operations, each with its status, times, history length and Temporal UI link. Filter by sandbox and by status.",
		Args: []Arg{{Name: "sandbox_id", Type: TypeString, Pattern: PatternID, Description: "Only this sandbox's workflow and publishes."},
			{Name: "status", Type: TypeString, Enum: []string{"running", "completed", "failed", "canceled", "terminated", "continued_as_new", "timed_out"}, Description: "Only workflows in this status."},
			intArg("limit", int64(100), i64(1), i64(1000), "At most this many.")},
		Result: map[string]string{"workflows": "array"}},
	{Name: "describe_workflow", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "Describe one Temporal workflow.",
		Description: "Its status, type, times, history length, what it is doing now (pending activities with their attempts, pending child workflows) and its Temporal UI link.",
		Args:        []Arg{argWorkflowID, {Name: "run_id", Type: TypeString, Pattern: PatternID, Description: "A run of it (default: the latest)."}},
		Result:      map[string]string{"workflow_id": "string", "status": "string", "pending_activities": "array"}},
	{Name: "wait_operation", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "Wait for an --async operation and return its result.",
		Description: "With the workflow_id and update_id an --async lifecycle call answered (publish, session create, export, squash...), waits for that update and returns its result, or its error exactly as the synchronous call would have. With only a workflow_id (an async create_sandbox), waits for the sandbox to be ready and returns its record. A wait that times out answers operation_failed and the operation goes on.",
		Args: []Arg{argWorkflowID, {Name: "update_id", Type: TypeString, Pattern: PatternWorkflowID, Description: "The update id of the async call (its request id)."},
			intArg("timeout_ms", int64(600000), i64(1), i64(3600000), "How long to wait.")},
		Result: map[string]string{"workflow_id": "string", "status": "string", "result": "object"}},
	{Name: "cancel_operation", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteRecords,
		Summary:     "Cancel a running workflow that is not a sandbox.",
		Description: "Asks a running publish or host operation workflow to stop; a publish that did not commit is aborted and its session kept, one that committed finishes. A sandbox's own workflow is refused (use destroy_sandbox): cancelling it would leave its container behind.",
		Args:        []Arg{argWorkflowID},
		Result:      map[string]string{"workflow_id": "string", "cancel_requested": "bool"}},
	{Name: "list_docker_images", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteHost,
		Summary:     "List local Docker images usable by create_sandbox.",
		Description: "Returns {images:[...]} with all local image references of the host (host; in a cluster, default the host a new sandbox would go to).",
		Args:        []Arg{argHost},
		Result:      map[string]string{"images": "array"}},
	{Name: "list_workspace_directories", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Route: RouteHost,
		Summary:     "List host directories that can serve as workspace_root.",
		Description: "Without path lists the allowed roots (the gateway's --allow-root directories); with path lists up to 500 immediate subdirectories.",
		Args:        []Arg{str("path", "Absolute host directory to list."), argHost},
		Result:      map[string]string{"path": "string", "parent": "string", "truncated": "boolean", "directories": "array"}},
	{Name: "squash_layerstacks", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Progress: true,
		Summary:     "Compact a sandbox's published layers.",
		Description: "Squashes runs of published layers into one, remounting live sessions. Safe to run at any time; changes nothing visible.",
		Args:        []Arg{argSandboxID},
		Result:      map[string]string{"manifest_version": "integer", "squashed_blocks": "array", "swept_sessions": "array"}},
	{Name: "export_changes", Group: GroupManagement, Scope: ScopeSystem, Lifecycle: true, Progress: true,
		Summary:     "Export all published changes of a sandbox to the host.",
		Description: "Folds every published layer above the base (newest wins) and writes it to dest: format dir applies the changes to the host directory, tar and tar-zst write an archive with whiteouts, patch a git-style patch. Format git writes the published history into the git repository at dest (the sandbox's workspace_root) as commits on branch, one per publish (author the session's agent, message naming the session and txid), by git plumbing: the working tree, index, HEAD and checked-out branches are never touched.",
		Args: []Arg{argSandboxID,
			reqStr("dest", "Absolute host path (directory for dir, file for tar formats), under the same rule as workspace_root: inside an allowed root, no symlink component."),
			{Name: "format", Type: TypeString, Default: "dir", Enum: []string{"dir", "tar", "tar-zst", "patch", "git"}, Description: "Export encoding: a directory, a tar or tar.zst of the layers (OCI whiteouts), a git-style patch of the published changes against the base, or commits on a branch of the git repository at dest."},
			{Name: "branch", Type: TypeString, Pattern: `^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$`, Description: "Format git: the branch to write (refs/heads/<branch>); refused when checked out, not a valid ref name, or existing and not an ancestor of the new commits (unless force)."},
			boolArg("force", "Format git: move an existing branch even when it is not an ancestor of the new commits.")},
		Result: map[string]string{"manifest_version": "integer", "format": "string", "layers_exported": "array", "files_written": "integer", "bytes_written": "integer",
			"branch": "string", "tip": "string", "parent": "string", "commits": "array"}},

	// --- runtime (sandbox scope) ---
	{Name: "exec_command", Group: GroupRuntime, Scope: ScopeSandbox, Progress: true,
		Summary:     "Run a shell command in the sandbox.",
		Description: "Runs cmd with /bin/sh -c under /workspace. Returns after the command ends or yield_time_ms passes; while status is \"running\" poll with read_command_lines or write_command_stdin using command_session_id. Without workspace_session_id the changes publish when the command ends.",
		Args: []Arg{
			{Name: "cmd", Type: TypeString, Required: true, Positional: true, Description: "Shell command line."},
			argWS,
			intArg("timeout_ms", int64(DefaultTimeoutMS), i64(1), i64(MaxTimeoutMS), "Kill the command after this many milliseconds (exit code 124)."),
			argYield,
			{Name: "env", Type: TypeObject, Description: "Extra environment variables {NAME: value}.", Schema: envSchema},
			str("cwd", "Working directory under /workspace."),
			boolArg("tty", "Run under a pseudo-terminal."),
			intArg("rows", nil, i64(1), i64(1000), "PTY rows."),
			intArg("cols", nil, i64(1), i64(1000), "PTY columns."),
		},
		Result: resCommand},
	{Name: "write_command_stdin", Group: GroupRuntime, Scope: ScopeSandbox, Progress: true,
		Summary:     "Write to a running command's stdin and collect output.",
		Description: "Writes stdin to the command. A \\x03 or \\x04 anywhere in stdin cancels the command instead (exit code 130).",
		Args: []Arg{argCmdID,
			{Name: "stdin", Type: TypeString, Required: true, Positional: true, Description: "Text to write."},
			argYield},
		Result: resCommand},
	{Name: "read_command_lines", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Page a command's output by line offset.",
		Description: "Returns lines [start_offset, start_offset+limit) of a command's output and its current status.",
		Args: []Arg{argCmdID,
			intArg("start_offset", int64(0), i64(0), nil, "First line (0-based)."),
			intArg("limit", int64(DefaultReadLimit), i64(1), i64(MaxReadLimit), "Maximum number of lines.")},
		Result: resCommand},
	{Name: "cancel_command", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Cancel a running command.",
		Description: "Sends SIGTERM to the command's process group, then SIGKILL. The command ends with status cancelled and exit code 130.",
		Args:        []Arg{argCmdID}, Result: resCommand},
	{Name: "resize_command", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Resize a PTY command's window.",
		Description: "Changes the window size of a command started with tty.",
		Args: []Arg{argCmdID,
			{Name: "rows", Type: TypeInt, Required: true, Min: i64(1), Max: i64(1000), Description: "Rows."},
			{Name: "cols", Type: TypeInt, Required: true, Min: i64(1), Max: i64(1000), Description: "Columns."}},
		Result: map[string]string{"command_session_id": "string", "resized": "boolean"}},
	{Name: "file_read", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Read a text file by line window.",
		Description: "Reads up to limit lines starting at 1-based line offset; content is the selected lines joined by newlines, without a final one (BOM stripped, CRLF read as LF). UTF-8 text only, 256 KiB output cap; continue with next_offset while it is not null.",
		Args: []Arg{reqStr("path", "File path, workspace-relative or under /workspace."),
			intArg("offset", int64(1), i64(1), nil, "First line, 1-based."),
			intArg("limit", int64(2000), i64(1), i64(2000), "Maximum number of lines."),
			argWS,
			boolArg("keep_final_newline", "Keep the newline ending the last selected line (the seed's content has none), so consecutive windows concatenate to the file's text.")},
		Result: map[string]string{"path": "string", "content": "string", "start_line": "integer", "num_lines": "integer", "total_lines": "integer", "bytes_read": "integer", "total_bytes": "integer", "next_offset": "integer|null", "truncated": "boolean"}},
	{Name: "file_write", Group: GroupRuntime, Scope: ScopeSandbox, AmendWhenSessionless: true,
		Summary:     "Create or overwrite a file.",
		Description: "Writes content to path. Without workspace_session_id the write is published at once as its own layer.",
		Args: []Arg{reqStr("path", "File path."), reqStr("content", "Full new content."), argWS,
			{Name: "executable", Type: TypeBool, Description: "Exec bit of a new file (existing files keep theirs)."}},
		Result: map[string]string{"type": "string", "path": "string", "bytes_written": "integer"}},
	{Name: "file_upload", Group: GroupRuntime, Scope: ScopeSandbox, AmendWhenSessionless: true, CLIUpload: "content_base64", RawHTTP: "PUT",
		Summary:     "Create or overwrite a file with any bytes.",
		Description: "Writes the bytes of content_base64 (standard base64) to path, like file_write but for binary files (images, archives, build outputs): NUL and invalid UTF-8 included. At most 8 MiB into a session; without workspace_session_id the write is published at once as its own layer, at most 1 MiB. HTTP: PUT /v1/sandboxes/<id>/files?path=P&workspace_session_id=W with the raw bytes as the body. CLI: --from LOCALFILE.",
		Args: []Arg{reqStr("path", "File path, workspace-relative or under /workspace."),
			{Name: "content_base64", Type: TypeString, Required: true, Pattern: `^[A-Za-z0-9+/]*={0,2}$`, Description: "The file's bytes, standard base64 with padding (the CLI reads them from --from LOCALFILE)."},
			argWS,
			{Name: "executable", Type: TypeBool, Description: "Exec bit of a new file (existing files keep theirs)."}},
		Result: map[string]string{"type": "string", "path": "string", "bytes_written": "integer", "sha256": "string"}},
	{Name: "file_download", Group: GroupRuntime, Scope: ScopeSandbox, CLIDownload: "content_base64", RawHTTP: "GET",
		Summary:     "Read a whole file as bytes.",
		Description: "Returns the bytes of a regular file (content_base64, standard base64), its size, sha256 and exec bit; any content, at most 8 MiB. Without workspace_session_id reads the published head. HTTP: GET /v1/sandboxes/<id>/files?path=P&workspace_session_id=W answers the raw bytes. CLI: --to LOCALFILE (an existing file needs --force).",
		Args:        []Arg{reqStr("path", "File path, workspace-relative or under /workspace."), argWS},
		Result:      map[string]string{"path": "string", "content_base64": "string", "size": "integer", "sha256": "string", "executable": "boolean"}},
	{Name: "file_edit", Group: GroupRuntime, Scope: ScopeSandbox, AmendWhenSessionless: true,
		Summary:     "Apply exact string replacements to a file.",
		Description: "Applies edits in order; each old_string must occur exactly once unless replace_all. Files over 4 MiB are refused.",
		Args: []Arg{reqStr("path", "File path."),
			{Name: "edits", Type: TypeArray, Required: true, Description: "JSON array of {old_string, new_string, replace_all?}.", Schema: editsSchema},
			argWS},
		Result: map[string]string{"type": "string", "path": "string", "edits_applied": "integer", "replacements": "integer", "bytes_written": "integer"}},
	{Name: "file_delete", Group: GroupRuntime, Scope: ScopeSandbox, AmendWhenSessionless: true,
		Summary:     "Delete a file or directory.",
		Description: "Deletes path; directories need recursive.",
		Args:        []Arg{reqStr("path", "Path to delete."), boolArg("recursive", "Delete a directory and its contents."), argWS},
		Result:      map[string]string{"path": "string", "deleted": "boolean"}},
	{Name: "file_move", Group: GroupRuntime, Scope: ScopeSandbox, AmendWhenSessionless: true,
		Summary:     "Move or rename a file or directory.",
		Description: "Moves from to to; an existing destination needs overwrite.",
		Args:        []Arg{reqStr("from", "Source path."), reqStr("to", "Destination path."), boolArg("overwrite", "Replace an existing destination."), argWS},
		Result:      map[string]string{"from": "string", "to": "string"}},
	{Name: "file_list", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "List a directory.",
		Description: "Lists the immediate entries of a directory (default the workspace root).",
		Args:        []Arg{str("path", "Directory path."), argWS, intArg("limit", nil, i64(1), i64(10000), "Maximum entries.")},
		Result:      map[string]string{"path": "string", "entries": "array", "truncated": "boolean"}},
	{Name: "file_search", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Find files by glob and lines by regular expression.",
		Description: "Walks path; glob filters paths (without / it matches base names), query is a regular expression matched against each line of text files.",
		Args: []Arg{str("path", "Directory to search."), str("glob", "Path glob, e.g. *.go."), str("query", "Regular expression."),
			intArg("limit", nil, i64(1), i64(10000), "Maximum matches."), argWS},
		Result: map[string]string{"matches": "array", "truncated": "boolean"}},
	{Name: "file_blame", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Show which publish last changed each line.",
		Description: "Published state only. Owners: operation:<request_id>, workspace_session:<id>, original.",
		Args:        []Arg{reqStr("path", "File path.")},
		Result:      map[string]string{"path": "string", "ranges": "array"}},
	{Name: "create_workspace_session", Group: GroupRuntime, Scope: ScopeSandbox, Lifecycle: true,
		Summary:     "Start an isolated workspace session.",
		Description: "A session is a private copy-on-write view of /workspace. Run commands and file ops in it with workspace_session_id, then publish_workspace_session or destroy_workspace_session.",
		Args: []Arg{{Name: "network_profile", Type: TypeString, Default: "shared", Enum: []string{"shared", "isolated"}, Description: "shared uses the sandbox network; isolated has its own namespace."},
			str("agent", "Free-form name of the agent owning the session."),
			{Name: "limits", Type: TypeObject, Description: "cgroup limits {pids_max, memory_bytes, cpus}.", Schema: limitsSchema},
			{Name: "egress", Type: TypeStringOrList, Default: "default", Enum: []string{"default", "none"},
				Description: "Isolated sessions only: default reaches the sandbox and what it reaches (never other sessions' namespaces); none reaches nothing; a list of \"cidr:port\" (e.g. [\"10.0.0.0/8:443\"]) reaches only those, TCP and UDP."},
			idArg(str("from", "Fork this workspace session: the new one starts as its workspace is now (its published base, shared, plus its unpublished changes, copied), then both go on and publish independently; arguments not given are inherited from it."))},
		Result: map[string]string{"workspace_session_id": "string", "network_profile": "string", "finalize_policy": "string", "egress": "string|array"}},
	{Name: "destroy_workspace_session", Group: GroupRuntime, Scope: ScopeSandbox, Lifecycle: true,
		Summary:     "Discard a workspace session and its changes.",
		Description: "Refused while commands run (details.active_command_session_ids) unless force.",
		Args:        []Arg{argWSReq, argGrace, boolArg("force", "Kill running commands.")},
		Result:      map[string]string{"workspace_session_id": "string", "destroyed": "boolean", "evicted_upperdir_bytes": "integer"}},
	{Name: "publish_workspace_session", Group: GroupRuntime, Scope: ScopeSandbox, Lifecycle: true, Progress: true,
		Summary: "Publish a session's changes as a new layer.",
		Description: "Commits the session's changes if they do not conflict with what was published since it started. The session is destroyed unless keep. On rejection the session is retained and details.publish_rejection explains why. " +
			"With verify it is a verified publish (a merge queue inside the sandbox): the command runs (sh -c) in a throwaway session of the would-be head (the current head with the session's changes merged; a conflict is reported as above before anything runs), with the session's network profile, egress and limits, and the publish commits only if it exits 0, onto exactly the head it verified; if another publish moved the head meanwhile it merges onto the new head and verifies again (verify_retries times). " +
			"A failing command is operation_failed with details.stage verify, reason verify_failed, exit_code, status, output_tail (the last 16 KiB), verified_head; a head that kept moving is operation_conflict with details.reason head_kept_moving; either way nothing is committed and the session keeps its work. " +
			"Verified publishes of one sandbox run one at a time in the order they were accepted (the snapshot's publish_queue: session, position, state, started_at); a publish without verify does not wait for them. The result then has verify (exit_code, output_tail, verified_head, attempts).",
		Args: []Arg{argWSReq, argGrace, boolArg("keep", "Keep the session, moved onto the new head."), str("message", "Publish message."),
			{Name: "verify", Type: TypeString, Pattern: `\S`, Description: "Verified publish: the command that must exit 0 on the would-be head before anything commits (e.g. \"make test\")."},
			{Name: "verify_timeout_s", Type: TypeInt, Min: i64(1), Max: i64(MaxVerifyTimeoutS), Aliases: []string{"verify-timeout"},
				Description: "Verified publish: the command's time limit in seconds (default 600); a command that overruns fails the publish (status timed_out)."},
			{Name: "verify_retries", Type: TypeInt, Min: i64(0), Max: i64(MaxVerifyRetries),
				Description: "Verified publish: how often to merge onto a head that moved during verification and verify again (default 2)."}},
		Result: map[string]string{"workspace_session_id": "string", "publish": "object", "destroyed": "boolean", "evicted_upperdir_bytes": "integer"}},
	{Name: "refresh_workspace_session", Group: GroupRuntime, Scope: ScopeSandbox, Lifecycle: true,
		Summary:     "Move a session onto the latest published state.",
		Description: "Rebases the session's unpublished changes onto the current head, merging per line; fails on conflict.",
		Args:        []Arg{argWSReq},
		Result:      map[string]string{"workspace_session_id": "string"}},
	{Name: "recover_workspace_session", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Bring a stuck workspace session back to active, keeping its work.",
		Description: "For a session that refuses exec, publish and refresh because it is left publishing or finalize_failed (a publish that never finished, a daemon or container restart, a failed remount): aborts its unfinished uncommitted publish, finalizes a committed one (which ends the session unless that publish kept it), finishes a destroy that could not end the session's processes (the session ends), and restarts the session over its upper dir, so its unpublished changes are kept. Safe to repeat; an active session stays as it is.",
		Args:        []Arg{argWSReq},
		Result:      map[string]string{"workspace_session_id": "string", "previous_state": "string", "state": "string", "aborted_txids": "array", "finalized_txids": "array", "destroyed": "boolean"}},
	{Name: "list_archived_sessions", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "List archived (idle-reaped) sessions and their kept work.",
		Description: "Sessions archived after session_idle_ttl without use: id, agent, archived_at, files_changed (files, symlinks and deletions not published) and bytes. Bring one back with restore_workspace_session.",
		Result:      map[string]string{"archived_sessions": "array"}},
	{Name: "restore_workspace_session", Group: GroupRuntime, Scope: ScopeSandbox, Lifecycle: true,
		Summary:     "Bring an archived session back as active, with its work.",
		Description: "Restarts an archived session over its kept upper dir and base, so its unpublished changes are there again and it publishes as before. An unknown id is not_found; an active session is failed_precondition.",
		Args:        []Arg{argWSReq},
		Result:      map[string]string{"workspace_session_id": "string", "state": "string", "files_changed": "integer", "rebased": "boolean"}},
	{Name: "list_workspace_sessions", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "List workspace sessions.",
		Description: "Returns live and archived sessions with their state and active commands.",
		Result:      map[string]string{"workspace_sessions": "array", "archived_sessions": "array"}},
	{Name: "diff_workspace_session", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Show a session's unpublished changes.",
		Description: "Lists the paths the session changed relative to its base.",
		Args:        []Arg{argWSReq},
		Result:      map[string]string{"workspace_session_id": "string", "changes": "array"}},
	{Name: "check_publish", Group: GroupRuntime, Scope: ScopeSandbox,
		Summary:     "Dry-run a publish.",
		Description: "Reports whether publish_workspace_session would succeed and, if not, the rejection, without changing anything.",
		Args:        []Arg{argWSReq},
		Result:      map[string]string{"workspace_session_id": "string", "ok": "boolean"}},

	// --- observability ---
	{Name: "snapshot", Group: GroupObservability, Scope: ScopeEither,
		Summary:     "Snapshot of a sandbox, or of the fleet without --sandbox-id.",
		Description: "Sandbox form: lifecycle state, daemon, resources (latest sample and the last minute), workspaces with their running commands, the layer stack's sizes, and publish_queue (the verified publishes waiting or running, in order: workspace_session_id, position, state queued or verifying, started_at). System form: {sandboxes:[...]}.",
		Result:      map[string]string{"sandbox_id": "string", "lifecycle_state": "string", "availability": "string", "sampled_at_unix_ms": "integer", "errors": "array", "daemon": "object", "resources": "object", "workspaces": "array", "stack": "object"}},
	{Name: "trace", Group: GroupObservability, Scope: ScopeSandbox,
		Summary: "Spans of one request.", Description: "The trace id is the request id of a call; calls the workflow layer makes for it (<workflow>/update/<request id>, <txid>/<step>) are found by either end, so a publish's txid shows all its steps. last selects the most recent. Spans nest by parent with their offset from the trace's start and their events inline.",
		Args:   []Arg{{Name: "trace_id", Type: TypeString, Default: "last", Description: "Trace (request) id or last."}},
		Result: map[string]string{"view": "string", "trace": "string", "spans": "array"}},
	{Name: "workflows", Group: GroupObservability, Scope: ScopeSandbox, Lifecycle: true, Route: RouteRecords,
		Summary:     "Temporal workflows of a sandbox.",
		Description: "The sandbox's own workflow and every publish it ran, with their status, times and a link into the Temporal UI where each one's history can be read step by step.",
		Args:        []Arg{intArg("limit", int64(100), i64(1), i64(1000), "At most this many workflows, newest first.")},
		Result:      map[string]string{"view": "string", "sandbox_id": "string", "workflows": "array"}},
	{Name: "events", Group: GroupObservability, Scope: ScopeSandbox,
		Summary: "Recent daemon events.", Description: "Newest first, folded across traces; at most 500 per call.",
		Args:   []Arg{str("name", "Only events of this name."), intArg("since_ms", nil, i64(0), nil, "Only events newer than this (unix ms)."), intArg("last_n", nil, i64(1), i64(10000), "At most this many events (default 100; the daemon returns at most 500).")},
		Result: map[string]string{"view": "string", "events": "array"}},
	{Name: "layerstack", Group: GroupObservability, Scope: ScopeSandbox,
		Summary: "Layer stack of a sandbox.", Description: "Layers newest first with logical and allocated sizes, leasing sessions and owners, storage totals and the stack's trend over window_ms; with workspace_id a session's mounts and upper-dir bytes; with layer_id a layer's entries (file, directory, symlink, delete, opaque_dir).",
		Args:   []Arg{str("workspace_id", "Workspace session id."), str("layer_id", "Layer id."), argWindow, intArg("limit", int64(500), i64(1), i64(10000), "Maximum entries of a layer_id listing.")},
		Result: map[string]string{"view": "string", "manifest_version": "integer", "root_hash": "string", "active_lease_count": "integer", "total_bytes": "integer", "total_allocated_bytes": "integer", "storage_logical_bytes": "integer", "storage_allocated_bytes": "integer", "staging_entry_count": "integer", "layers": "array", "trend": "array"}},
	{Name: "cgroup", Group: GroupObservability, Scope: ScopeSandbox,
		Summary: "cgroup usage of a sandbox or session.", Description: "CPU, memory, pids and I/O samples of the window (oldest first) plus the process topology; a workspace scope shows that session only.",
		Args:   []Arg{{Name: "scope", Type: TypeString, Default: "sandbox", Description: "sandbox or a workspace session id."}, argWindow},
		Result: map[string]string{"view": "string", "scope": "string", "series": "array", "topology": "object"}},
	{Name: "resources", Group: GroupObservability, Scope: ScopeEither,
		Summary: "Resource samples.", Description: "Sandbox form reads the daemon's on-disk samples (sandbox, stack and each session, oldest first; taken every 2 s only while the sandbox is active); system form the fleet.",
		Args:   []Arg{argWindow},
		Result: map[string]string{"view": "string", "scope": "string", "sandbox_id": "string", "source": "string", "availability": "string", "errors": "array", "series": "array"}},
	{Name: "topology", Group: GroupObservability, Scope: ScopeSandbox,
		Summary: "Processes grouped per workspace.", Description: "One bounded /proc namespace walk.",
		Result: map[string]string{"view": "string", "scope": "string", "topology": "object"}},
	{Name: "daemon", Group: GroupObservability, Scope: ScopeSandbox,
		Summary: "Daemon process diagnostics.", Description: "The daemon's process, runtime and ownership sample, the requests it is serving now (requests.in_flight_ops, by operation), and its observability store with drop counters.",
		Result: map[string]string{"view": "string", "scope": "string", "daemon": "object"}},
	{Name: "publish_history", Group: GroupObservability, Scope: ScopeSandbox,
		Summary:     "Who published what, and when.",
		Description: "Every publish outcome newest first: merged, clean, no_op, or conflict with the conflicting paths; from sessions, implicit sessions (exec without a session) and sessionless file writes, with agent label, layer, changed paths (first 50 and a count), message and trace id.",
		Args:        []Arg{intArg("limit", int64(100), i64(1), i64(500), "At most this many publishes."), str("workspace_session_id", "Only publishes of this workspace session.")},
		Result:      map[string]string{"view": "string", "publishes": "array"}},

	// --- internal (refused at public doors) ---
	{Name: "init_base", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Import the base layer.", Description: "Workflow only."},
	{Name: "publish_prepare", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Publish step 1.", Description: "Workflow only."},
	{Name: "publish_commit", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Publish step 2.", Description: "Workflow only."},
	{Name: "publish_finalize", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Publish step 3.", Description: "Workflow only."},
	{Name: "publish_abort", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Publish rollback.", Description: "Workflow only."},
	{Name: "squash_layerstack", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Daemon-side squash.", Description: "Workflow only."},
	{Name: "export_layerstack", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Daemon-side export stream.", Description: "Workflow only."},
	{Name: "archive_idle_sessions", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Archive idle sessions.", Description: "Workflow only."},
	{Name: "read_export_chunk", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Seed export paging.", Description: "Internal."},
	{Name: "sandbox_daemon_ready", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Readiness handshake.", Description: "Internal."},
	{Name: "amend", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Workflow amend update.", Description: "Internal."},
	{Name: "wait_ready", Group: GroupInternal, Scope: ScopeSandbox, Internal: true, Summary: "Workflow readiness update.", Description: "Internal."},
}

// asyncOps are the lifecycle operations that can return as soon as the
// sandbox workflow accepted them (async: true) instead of waiting.
var asyncOps = map[string]bool{
	"create_sandbox": true, "destroy_sandbox": true, "squash_layerstacks": true, "export_changes": true,
	"create_workspace_session": true, "destroy_workspace_session": true, "publish_workspace_session": true,
	"refresh_workspace_session": true, "pause_sandbox": true, "resume_sandbox": true,
}

var argAsync = boolArg("async", "Return as soon as the sandbox's workflow accepted the operation, with its workflow id, instead of waiting for the result (follow it in the Temporal UI).")

var catalogIndex = func() map[string]*Operation {
	m := make(map[string]*Operation, len(catalog))
	for i := range catalog {
		if asyncOps[catalog[i].Name] {
			catalog[i].Args = append(catalog[i].Args, argAsync)
		}
		m[catalog[i].Name] = &catalog[i]
	}
	return m
}()

// Catalog returns every operation, internal ones included.
func Catalog() []Operation { return catalog }

// LookupOp returns the named operation (internal ones included).
func LookupOp(name string) (*Operation, bool) {
	o, ok := catalogIndex[name]
	return o, ok
}

// PublicOps returns the public operations of a group ("" = all groups).
func PublicOps(group string) []Operation {
	var out []Operation
	for _, o := range catalog {
		if !o.Internal && (group == "" || o.Group == group) {
			out = append(out, o)
		}
	}
	return out
}

// ResolvePublic finds a public operation, or returns unknown_op for unknown
// names and invalid_request for internal ones.
func ResolvePublic(name string) (*Operation, *Error) {
	o, ok := LookupOp(name)
	if !ok {
		return nil, Errorf(KindUnknownOp, map[string]any{"op": name}, "unknown operation: %s", name)
	}
	if o.Internal {
		return nil, Errorf(KindInvalidRequest, map[string]any{"op": name, "internal": true}, "operation %s is internal and not available through the gateway", name)
	}
	return o, nil
}

// CheckScope validates the scope kind ("system" or "sandbox") against the
// op (a request that names none has ScopeOf's).
func (o *Operation) CheckScope(kind, sandboxID string) *Error {
	switch kind {
	case ScopeSystem:
		if o.Scope == ScopeSandbox {
			return Errorf(KindInvalidRequest, map[string]any{"op": o.Name}, "%s requires sandbox scope (a sandbox_id)", o.Name)
		}
	case ScopeSandbox:
		if o.Scope == ScopeSystem {
			return Errorf(KindInvalidRequest, map[string]any{"op": o.Name}, "%s is a system-scope operation", o.Name)
		}
		if sandboxID == "" {
			return Errorf(KindInvalidRequest, map[string]any{"op": o.Name}, "sandbox scope requires sandbox_id")
		}
		if !patternOf(PatternID).MatchString(sandboxID) {
			return Errorf(KindInvalidRequest, map[string]any{"op": o.Name, "arg": "sandbox_id"}, "%q is not a valid sandbox_id", truncateArg(sandboxID))
		}
	default:
		return Errorf(KindInvalidRequest, map[string]any{"scope": kind}, "scope.kind must be system or sandbox")
	}
	return nil
}

// ScopeOf is the scope kind of a request to o that names none: sandbox
// when it gives a sandbox_id and o takes a sandbox scope, else system.
func (o *Operation) ScopeOf(sandboxID string) string {
	if sandboxID != "" && o.Scope != ScopeSystem {
		return ScopeSandbox
	}
	return ScopeSystem
}

// Validate checks args against the op: unknown args, required args, types,
// enums and limits. Errors are invalid_request with details.arg.
func (o *Operation) Validate(args map[string]any) *Error {
	for k := range args {
		if _, ok := o.Arg(k); !ok {
			return Errorf(KindInvalidRequest, map[string]any{"op": o.Name, "arg": k}, "unknown argument %q for %s", k, o.Name)
		}
	}
	for _, a := range o.Args {
		v, present := args[a.Name]
		if !present || v == nil {
			if a.Required {
				return Errorf(KindInvalidRequest, map[string]any{"op": o.Name, "arg": a.Name}, "%s is required for %s", a.Name, o.Name)
			}
			continue
		}
		if err := a.check(o.Name, v); err != nil {
			return err
		}
	}
	return nil
}

func (a Arg) check(op string, v any) *Error {
	bad := func(format string, x ...any) *Error {
		return Errorf(KindInvalidRequest, map[string]any{"op": op, "arg": a.Name}, "%s: "+format, append([]any{a.Name}, x...)...)
	}
	switch a.Type {
	case TypeString:
		s, ok := v.(string)
		if !ok {
			return bad("must be a string")
		}
		if a.Required && s == "" {
			return bad("must not be empty")
		}
		if a.Pattern != "" && s != "" && !patternOf(a.Pattern).MatchString(s) {
			return bad("%q is not a valid %s", truncateArg(s), a.Name)
		}
		if len(a.Enum) > 0 && s != "" {
			found := false
			for _, e := range a.Enum {
				found = found || e == s
			}
			if !found {
				return bad("must be one of %s", strings.Join(a.Enum, ", "))
			}
		}
	case TypeInt:
		n, ok := asInt(v)
		if !ok {
			return bad("must be an integer")
		}
		if a.Min != nil && n < *a.Min {
			return bad("must be at least %d", *a.Min)
		}
		if a.Max != nil && n > *a.Max {
			return bad("must be at most %d", *a.Max)
		}
	case TypeBool:
		if _, ok := v.(bool); !ok {
			return bad("must be a boolean")
		}
	case TypeObject:
		m, ok := v.(map[string]any)
		if !ok {
			return bad("must be an object")
		}
		return a.checkProperties(op, m)
	case TypeArray:
		if _, ok := v.([]any); !ok {
			return bad("must be an array")
		}
	case TypeStringOrList:
		switch x := v.(type) {
		case string:
			for _, e := range a.Enum {
				if e == x {
					return nil
				}
			}
			return bad("must be one of %s or an array of strings", strings.Join(a.Enum, ", "))
		case []any:
			for _, e := range x {
				if _, ok := e.(string); !ok {
					return bad("must be an array of strings")
				}
			}
		case []string:
		default:
			return bad("must be one of %s or an array of strings", strings.Join(a.Enum, ", "))
		}
	default:
		return bad("has unknown type %s", a.Type)
	}
	return nil
}

// checkProperties checks an object arg's properties against what its
// Schema declares of them: no others when additionalProperties is false,
// and integer and number properties' types and bounds (minimum,
// exclusiveMinimum, maximum). Errors name the property in details.arg
// ("limits.cpus").
func (a Arg) checkProperties(op string, m map[string]any) *Error {
	props, _ := a.Schema["properties"].(map[string]any)
	if props == nil {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := a.Name + "." + k
		bad := func(format string, x ...any) *Error {
			return Errorf(KindInvalidRequest, map[string]any{"op": op, "arg": name}, "%s: "+format, append([]any{name}, x...)...)
		}
		p, ok := props[k].(map[string]any)
		if !ok {
			if a.Schema["additionalProperties"] == false {
				return bad("unknown property of %s", a.Name)
			}
			continue
		}
		v := m[k]
		if v == nil {
			continue
		}
		var n float64
		switch p["type"] {
		case "integer":
			i, ok := asInt(v)
			if !ok {
				return bad("must be an integer")
			}
			n = float64(i)
		case "number":
			f, ok := asNumber(v)
			if !ok {
				return bad("must be a finite number")
			}
			n = f
		default:
			continue
		}
		if min, ok := asNumber(p["minimum"]); ok && n < min {
			return bad("must be at least %v", p["minimum"])
		}
		if min, ok := asNumber(p["exclusiveMinimum"]); ok && n <= min {
			return bad("must be greater than %v", p["exclusiveMinimum"])
		}
		if max, ok := asNumber(p["maximum"]); ok && n > max {
			return bad("must be at most %v", p["maximum"])
		}
	}
	return nil
}

// asNumber is v as a finite number, however the door decoded it.
func asNumber(v any) (float64, bool) {
	var f float64
	switch n := v.(type) {
	case float64:
		f = n
	case json.Number:
		var err error
		if f, err = n.Float64(); err != nil {
			return 0, false
		}
	default:
		i, ok := asInt(v)
		return float64(i), ok
	}
	return f, !math.IsNaN(f) && !math.IsInf(f, 0)
}

// IntArg is args[name] as an integer, however the door decoded it (a
// json.Number from HTTP and JSON lines, a float64 from MCP, an int from
// Go); false when it is absent or not a whole number. Validate has checked
// the type and bounds the catalog gives.
func IntArg(args map[string]any, name string) (int64, bool) {
	v, ok := args[name]
	if !ok {
		return 0, false
	}
	return asInt(v)
}

func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case float64:
		if n != math.Trunc(n) || math.IsInf(n, 0) || math.Abs(n) > 1<<53 {
			return 0, false
		}
		return int64(n), true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

// jsonSchemaType maps an Arg type to a JSON Schema type.
func jsonSchemaType(t string) string {
	switch t {
	case TypeInt:
		return "integer"
	case TypeBool:
		return "boolean"
	}
	return t
}

// ArgsSchema is the JSON Schema of the op's args object: types, required
// args, defaults, limits and enums, and no other properties.
func (o *Operation) ArgsSchema() map[string]any {
	props := map[string]any{}
	req := []string{}
	for _, a := range o.Args {
		p := map[string]any{"type": jsonSchemaType(a.Type), "description": a.Description}
		for k, v := range a.Schema {
			p[k] = v
		}
		if a.Default != nil {
			p["default"] = a.Default
		}
		if a.Min != nil {
			p["minimum"] = *a.Min
		}
		if a.Max != nil {
			p["maximum"] = *a.Max
		}
		if len(a.Enum) > 0 {
			p["enum"] = a.Enum
		}
		if a.Pattern != "" {
			p["pattern"] = a.Pattern
		}
		if a.Type == TypeStringOrList {
			delete(p, "type")
			delete(p, "enum")
			p["oneOf"] = []any{map[string]any{"type": "string", "enum": a.Enum},
				map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}
		}
		props[a.Name] = p
		if a.Required {
			req = append(req, a.Name)
		}
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(req) > 0 {
		s["required"] = req
	}
	return s
}

func (o *Operation) resultSchema() map[string]any {
	props := map[string]any{}
	keys := make([]string, 0, len(o.Result))
	for k := range o.Result {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ts := strings.Split(o.Result[k], "|")
		if len(ts) == 1 {
			props[k] = map[string]any{"type": ts[0]}
		} else {
			props[k] = map[string]any{"type": ts}
		}
	}
	return map[string]any{"type": "object", "properties": props, "additionalProperties": true}
}

// OpenAPI renders the public catalog as an OpenAPI 3.1 document: one
// POST /v1/ops/<op> path per public operation.
func OpenAPI() []byte {
	paths := map[string]any{}
	// Every answer of an authenticated POST /v1/ops/<op>, refusals too,
	// carries these.
	opHeaders := map[string]any{
		"X-Request-Id": map[string]any{"description": "the request's id (the one sent, else a new one): its trace id", "schema": map[string]any{"type": "string"}},
		ServerTimingHeader: map[string]any{"description": "W3C Server Timing: " + TimingGateway + ";dur=<ms> (the gateway's whole time), and for an operation the gateway sends to the daemon " +
			TimingDaemonRPC + ";dur=<ms> (its daemon calls, there and back) and " + TimingDaemon + ";dur=<ms> (the daemon's own part)", "schema": map[string]any{"type": "string"}},
	}
	errContent := map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/ErrorEnvelope"}}}
	errResp := map[string]any{"description": "error envelope", "headers": opHeaders, "content": errContent}
	for i := range catalog {
		o := &catalog[i]
		if o.Internal {
			continue
		}
		scopeDesc := "system scope"
		if o.Scope == ScopeSandbox {
			scopeDesc = "sandbox scope: scope.sandbox_id is required"
		} else if o.Scope == ScopeEither {
			scopeDesc = "system or sandbox scope"
		}
		body := map[string]any{"type": "object", "properties": map[string]any{
			"request_id": map[string]any{"type": "string"},
			"scope":      map[string]any{"$ref": "#/components/schemas/Scope"},
			"args":       o.ArgsSchema(),
		}}
		paths["/v1/ops/"+o.Name] = map[string]any{"post": map[string]any{
			"operationId": o.Name,
			"tags":        []string{o.Group},
			"summary":     o.Summary,
			"description": o.Description + " (" + scopeDesc + ")",
			"requestBody": map[string]any{"required": false, "content": map[string]any{"application/json": map[string]any{"schema": body}}},
			"responses": map[string]any{
				"200":     map[string]any{"description": "result", "headers": opHeaders, "content": map[string]any{"application/json": map[string]any{"schema": o.resultSchema()}}},
				"default": errResp,
			},
		}}
	}
	for i := range catalog {
		if o := &catalog[i]; o.RawHTTP != "" && !o.Internal {
			rawHTTPPath(paths, o, map[string]any{"description": "error envelope", "content": errContent})
		}
	}
	doc := map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": "sandbox-gateway", "version": "v1", "description": "Ephemeral Sandbox gateway. Authenticate with Authorization: Bearer <token from ~/.ephemeral-sandbox/gateway.token>."},
		"paths":   paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
			"schemas": map[string]any{
				"Scope": map[string]any{"type": "object", "properties": map[string]any{
					"kind": map[string]any{"type": "string", "enum": []string{"system", "sandbox"},
						"description": "Left out: sandbox when sandbox_id is given to an operation that takes a sandbox scope, else system."},
					"sandbox_id": map[string]any{"type": "string"}}},
				"ErrorEnvelope": map[string]any{"type": "object", "required": []string{"error"}, "properties": map[string]any{
					"error": map[string]any{"type": "object", "required": []string{"kind", "message", "details"}, "properties": map[string]any{
						"kind": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"}, "details": map[string]any{"type": "object"}}}}},
			},
		},
		"security": []any{map[string]any{"bearer": []string{}}},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("openapi: %v", err))
	}
	return b
}

// rawHTTPPath adds an op's raw-bytes route to the OpenAPI paths.
func rawHTTPPath(paths map[string]any, o *Operation, errResp map[string]any) {
	params := []any{map[string]any{"name": "sandbox_id", "in": "path", "required": true, "schema": map[string]any{"type": "string", "pattern": PatternID}}}
	for _, a := range o.Args {
		if a.Name == o.CLIUpload {
			continue
		}
		params = append(params, map[string]any{"name": a.Name, "in": "query", "required": a.Required, "description": a.Description,
			"schema": map[string]any{"type": jsonSchemaType(a.Type)}})
	}
	bytesContent := map[string]any{"application/octet-stream": map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}
	entry := map[string]any{"operationId": o.Name + "_raw", "tags": []string{o.Group}, "summary": o.Summary + " (raw bytes)",
		"description": o.Description, "parameters": params, "responses": map[string]any{"default": errResp}}
	if o.CLIUpload != "" {
		entry["requestBody"] = map[string]any{"required": true, "content": bytesContent}
		entry["responses"].(map[string]any)["200"] = map[string]any{"description": "result", "content": map[string]any{"application/json": map[string]any{"schema": o.resultSchema()}}}
	} else {
		entry["responses"].(map[string]any)["200"] = map[string]any{"description": "the file's bytes (X-Content-Sha256, X-Executable headers)", "content": bytesContent}
	}
	m, _ := paths[FilesPath].(map[string]any)
	if m == nil {
		m = map[string]any{}
		paths[FilesPath] = m
	}
	m[strings.ToLower(o.RawHTTP)] = entry
}
