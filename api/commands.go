package api

// Command statuses.
const (
	StatusRunning   = "running"
	StatusOK        = "ok"
	StatusError     = "error"
	StatusTimedOut  = "timed_out"
	StatusCancelled = "cancelled"
)

// Exit codes the seed reports for ends that are not a normal exit.
const (
	ExitTimeout   = 124
	ExitCancelled = 130
)

// Command limits and defaults.
const (
	DefaultTimeoutMS   = 10 * 60 * 1000 // a command without timeout_ms runs at most 10 minutes
	MaxTimeoutMS       = 24 * 60 * 60 * 1000
	DefaultYieldTimeMS = 1000
	MaxYieldTimeMS     = 5 * 60 * 1000
	DefaultReadLimit   = 200
	MaxReadLimit       = 1000
	MaxStdinBytes      = 1 << 20
	// MaxCommandBytes bounds cmd, and the env's names and values together
	// ("k=v" each): Linux takes no argument or variable longer than 128
	// KiB with its NUL (MAX_ARG_STRLEN), so a longer cmd never started.
	// (Both near the cap together can pass the session init's 256 KiB start
	// request; that start is refused as invalid_request too.)
	MaxCommandBytes = 128<<10 - 1
	// RetainedCommands is how many finished commands stay readable.
	RetainedCommands = 512
)

// ExecCommandArgs starts a command. Without WorkspaceSessionID the command
// runs in an implicit session that publishes when its last command ends.
type ExecCommandArgs struct {
	Cmd                string            `json:"cmd"`
	WorkspaceSessionID string            `json:"workspace_session_id,omitempty"`
	TimeoutMS          *int64            `json:"timeout_ms,omitempty"`
	YieldTimeMS        *int64            `json:"yield_time_ms,omitempty"`
	Env                map[string]string `json:"env,omitempty"`
	Cwd                string            `json:"cwd,omitempty"` // under /workspace
	TTY                bool              `json:"tty,omitempty"`
	Rows               uint16            `json:"rows,omitempty"`
	Cols               uint16            `json:"cols,omitempty"`
}

// WriteCommandStdinArgs writes to a running command. A \x03 (ETX) or \x04
// (EOT) anywhere in Stdin cancels the command instead (the seed's rule).
type WriteCommandStdinArgs struct {
	CommandSessionID string `json:"command_session_id"`
	Stdin            string `json:"stdin"`
	YieldTimeMS      *int64 `json:"yield_time_ms,omitempty"`
}

// ReadCommandLinesArgs pages a command's output by line offset.
type ReadCommandLinesArgs struct {
	CommandSessionID string `json:"command_session_id"`
	StartOffset      int    `json:"start_offset,omitempty"`
	Limit            int    `json:"limit,omitempty"`
}

// CancelCommandArgs cancels a command (SIGTERM to its process group, then SIGKILL).
type CancelCommandArgs struct {
	CommandSessionID string `json:"command_session_id"`
}

// ResizeCommandArgs changes a PTY command's window size.
type ResizeCommandArgs struct {
	CommandSessionID string `json:"command_session_id"`
	Rows             uint16 `json:"rows"`
	Cols             uint16 `json:"cols"`
}

// OutputLine is one line of a command's output.
type OutputLine struct {
	Offset int    `json:"offset"`
	Stream string `json:"stream"` // stdout, stderr (pty: stdout)
	Text   string `json:"text"`
}

// CommandOutput is the seed's command output shape, plus the lines with
// their stream so stdout and stderr can be told apart.
type CommandOutput struct {
	Status                  string       `json:"status"`
	ExitCode                *int         `json:"exit_code"`
	WallTimeSeconds         float64      `json:"wall_time_seconds"`
	CommandTotalTimeSeconds float64      `json:"command_total_time_seconds"`
	StartOffset             int          `json:"start_offset"`
	EndOffset               int          `json:"end_offset"`
	TotalLines              int          `json:"total_lines"`
	OriginalTokenCount      int          `json:"original_token_count"`
	Output                  string       `json:"output"`
	Stdout                  string       `json:"stdout"`
	Stderr                  string       `json:"stderr"`
	Lines                   []OutputLine `json:"lines,omitempty"`
	Truncated               bool         `json:"truncated,omitempty"`
	// OutputDropped says why a finished command has no lines left: the
	// daemon dropped them to stay within its retained output budget.
	OutputDropped      string `json:"output_dropped,omitempty"`
	CommandSessionID   string `json:"command_session_id"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	// Implicit sessions: the outcome of the publish after the last command.
	PublishRejected    *bool          `json:"publish_rejected,omitempty"`
	PublishRejectClass string         `json:"publish_reject_class,omitempty"`
	PublishConflicts   []Conflict     `json:"publish_conflicts,omitempty"`
	Publish            map[string]any `json:"publish,omitempty"`
}

// ContentTypeNDJSON is the media type of a daemon answer that streams a
// command's output: one JSON object per line, {"line": OutputLine} as the
// command prints each line, then exactly one {"result": ...} or
// {"error": {...}}. A caller asks for it with Accept.
const ContentTypeNDJSON = "application/x-ndjson"
