package api

// Edit replaces OldString by NewString in a file: exactly one occurrence
// unless ReplaceAll. Edits apply in order, each to the previous result.
type Edit struct {
	OldString  string `json:"old_string"`
	NewString  string `json:"new_string"`
	ReplaceAll bool   `json:"replace_all,omitempty"`
}

// CreateSessionArgs are the arguments of create_workspace_session.
type CreateSessionArgs struct {
	NetworkProfile string         `json:"network_profile,omitempty"` // shared (default) or isolated
	Agent          string         `json:"agent,omitempty"`
	Limits         *SessionLimits `json:"limits,omitempty"`
	// Egress is an isolated session's egress policy (nil = default).
	Egress *Egress `json:"egress,omitempty"`
	// From forks that session: the new one starts as its workspace is now.
	From string `json:"from,omitempty"`
	// RequestID is the daemon's own copy of the call's request id (never
	// read from the body): a create retried under the same id answers the
	// session the first one made.
	RequestID string `json:"-"`
}

// SessionLimits are a session's cgroup limits on the wire.
type SessionLimits struct {
	PidsMax     int64   `json:"pids_max,omitempty"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
}

// SessionInfo describes a session on the wire.
type SessionInfo struct {
	WorkspaceSessionID string   `json:"workspace_session_id"`
	NetworkProfile     string   `json:"network_profile"`
	FinalizePolicy     string   `json:"finalize_policy"`
	Agent              string   `json:"agent,omitempty"`
	State              string   `json:"finalization_state"`
	Implicit           bool     `json:"implicit"`
	Created            string   `json:"created"`
	ManifestVersion    int64    `json:"base_manifest_version"`
	IP                 string   `json:"ip,omitempty"`
	Egress             *Egress  `json:"egress,omitempty"` // isolated sessions
	ActiveCommands     []string `json:"active_command_session_ids"`
	IdleSeconds        int64    `json:"idle_seconds"`
	ForkedFrom         string   `json:"forked_from,omitempty"` // the session it was forked from
}

// DestroySessionArgs are the arguments of destroy_workspace_session.
type DestroySessionArgs struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
	GraceS             *int   `json:"grace_s,omitempty"`
	// Force kills running commands instead of refusing.
	Force bool `json:"force,omitempty"`
}

// PublishArgs are publish_workspace_session's arguments. TxID makes the
// publish idempotent (the workflow layer derives it); the default is unique
// per session generation.
type PublishArgs struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
	TxID               string `json:"txid,omitempty"`
	Keep               bool   `json:"keep,omitempty"`
	Message            string `json:"message,omitempty"`
	GraceS             *int   `json:"grace_s,omitempty"`
	// ExactlyOnce (the sandbox workflow's publish): TxID is required and
	// the publish happens once however often it is retried, a retry
	// answering as the first call did; the answer is a PublishTxResult
	// (a rejection is an answer, not an error), and closing a session
	// that is not kept runs after the answer (the boot reconcile finishes
	// it after a crash).
	ExactlyOnce bool `json:"exactly_once,omitempty"`
	// Verify (with ExactlyOnce) commits only if Verify.Cmd exits 0 in a
	// throwaway session of the would-be head (see PublishVerify).
	Verify *PublishVerify `json:"verify,omitempty"`
}

// Verified publish bounds (publish_workspace_session verify,
// verify_timeout_s, verify_retries).
const (
	DefaultVerifyTimeoutS = 600
	MaxVerifyTimeoutS     = 3600
	DefaultVerifyRetries  = 2
	MaxVerifyRetries      = 5
	MaxVerifyCmdBytes     = 16 << 10
	// VerifyOutputTailBytes caps the output a verification returns.
	VerifyOutputTailBytes = 16 << 10
)

// PublishVerify is a verified publish's check: Cmd runs (sh -c) in a
// throwaway session whose /workspace is the would-be head (the head with
// the session's change set merged), with the session's network profile,
// egress and limits, for at most TimeoutMS; the publish commits only if it
// exits 0, and only onto the head it verified (compare and commit). If the
// head moved meanwhile the change is merged onto the new head and verified
// again, at most Retries times.
type PublishVerify struct {
	Cmd       string `json:"cmd"`
	TimeoutMS int64  `json:"timeout_ms"`
	Retries   int    `json:"retries"`
}

// VerifyReport is what a verification found: in a verified publish's
// result (verify), or in the details of its rejection.
type VerifyReport struct {
	Passed bool `json:"passed"`
	// Status is the command's (ok, error, timed_out, cancelled).
	Status     string `json:"status"`
	ExitCode   *int   `json:"exit_code"`
	OutputTail string `json:"output_tail"`
	// OutputTruncated: the output was longer than its tail.
	OutputTruncated bool `json:"output_truncated,omitempty"`
	// VerifiedHead is the head the change set was merged onto and
	// verified against (and, when it passed and committed, committed onto).
	VerifiedHead Revision `json:"verified_head"`
	Attempts     int      `json:"attempts"`
	WallTimeMS   int64    `json:"wall_time_ms"`
}

// SessionArgs name a session.
type SessionArgs struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
}

// FileReadArgs are file_read's arguments.
type FileReadArgs struct {
	Path               string `json:"path"`
	Offset             int    `json:"offset,omitempty"` // 1-based first line
	Limit              int    `json:"limit,omitempty"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	KeepFinalNewline   bool   `json:"keep_final_newline,omitempty"`
}

// FileReadResult is file_read's result.
type FileReadResult struct {
	Path       string `json:"path"`
	Content    string `json:"content"`
	StartLine  int    `json:"start_line"`
	NumLines   int    `json:"num_lines"`
	TotalLines int    `json:"total_lines"`
	BytesRead  int    `json:"bytes_read"`
	TotalBytes int64  `json:"total_bytes"`
	NextOffset *int   `json:"next_offset"`
	Truncated  bool   `json:"truncated"`
}

// FileWriteArgs are file_write's arguments.
type FileWriteArgs struct {
	Path               string `json:"path"`
	Content            string `json:"content"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	Executable         *bool  `json:"executable,omitempty"` // a new file's exec bit (existing files keep theirs)
}

// FileEditArgs are file_edit's arguments.
type FileEditArgs struct {
	Path               string `json:"path"`
	Edits              []Edit `json:"edits"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
}

// FileListArgs are file_list's (and POST /files/list's) arguments.
type FileListArgs struct {
	Path               string `json:"path,omitempty"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	Limit              int    `json:"limit,omitempty"`
}

// ListEntry is one file_list entry.
type ListEntry struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // file, directory, symlink, other
	Size int64  `json:"size"`
}

// FileDeleteArgs are file_delete's arguments.
type FileDeleteArgs struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive,omitempty"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
}

// FileMoveArgs are file_move's arguments.
type FileMoveArgs struct {
	From               string `json:"from"`
	To                 string `json:"to"`
	Overwrite          bool   `json:"overwrite,omitempty"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
}

// FileSearchArgs are file_search's arguments: Glob filters paths (a pattern
// without "/" matches base names), Query is a regular expression matched
// against each line of text files.
type FileSearchArgs struct {
	Path               string `json:"path,omitempty"`
	Glob               string `json:"glob,omitempty"`
	Query              string `json:"query,omitempty"`
	Limit              int    `json:"limit,omitempty"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
}

// SearchMatch is one file_search hit (Line 0 for a path-only match).
type SearchMatch struct {
	Path string `json:"path"`
	Line int    `json:"line,omitempty"`
	Text string `json:"text,omitempty"`
}

// InitBaseArgs import the sandbox's base from a directory inside the
// container (the product copies the host tree there first).
type InitBaseArgs struct {
	SourceDir string `json:"source_dir"`
	All       bool   `json:"all,omitempty"` // include gitignored files of a git work tree
	Remove    bool   `json:"remove_source,omitempty"`
	// BaseID initialises from a base another sandbox imported into a shared
	// base volume (mounted at the store's base/), instead of SourceDir.
	BaseID string `json:"base_id,omitempty"`
}

// DaemonRestartLog is the message the sandbox container's PID 1 (the
// daemon's supervisor) logs each time the daemon exits and it starts
// another: the gateway counts these in the container's output to tell a
// daemon that cannot start from one still starting.
const DaemonRestartLog = "daemon exited; restarting it"

// ImportBasePath is the daemon route a workspace tar is streamed to
// (POST, the body is the tar; ?all=true takes gitignored files too): the
// daemon imports it as the base in one pass and answers InitBaseResult.
// Internal: only the worker's create saga calls it.
const ImportBasePath = "/import/base"

// ExportArgs select the export encoding.
type ExportArgs struct {
	Format string `json:"format,omitempty"` // tar (default), tar-zst, patch
	// LayerID exports only that published layer (a tar of what its publish
	// changed); the answer's X-Layer-Meta header is the base64 of its
	// LayerExportMeta.
	LayerID string `json:"layer_id,omitempty"`
}

// LayerExportMeta is who published an exported layer, and when.
type LayerExportMeta struct {
	LayerID string `json:"layer_id"`
	Kind    string `json:"kind"`
	TxID    string `json:"txid,omitempty"`
	Owner   string `json:"owner,omitempty"`
	Agent   string `json:"agent,omitempty"`
	Message string `json:"message,omitempty"`
	Time    string `json:"time"` // RFC 3339
	// SquashedTxIDs: a squash layer's publishes, oldest first.
	SquashedTxIDs []string `json:"squashed_txids,omitempty"`
}

// PublishStepArgs drive the publish steps the workflow layer runs one by
// one, each idempotent by TxID: publish_prepare (capture and freeze the
// session's changes, dry-run them, stop admitting commands),
// publish_commit (commit the frozen changes), publish_finalize (destroy the
// session, or with Keep move it onto the new head) and publish_abort (give
// the session back after a rejected commit).
type PublishStepArgs struct {
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	TxID               string `json:"txid"`
	Keep               bool   `json:"keep,omitempty"`
	Message            string `json:"message,omitempty"`
}
