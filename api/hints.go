package api

// Hints describe how an operation behaves, for clients that decide whether
// to ask a human before calling it (MCP tool annotations, the CLIs' help).
type Hints struct {
	// ReadOnly: the operation changes nothing.
	ReadOnly bool `json:"read_only"`
	// Destructive: it may discard or overwrite work (unpublished changes,
	// host files, a whole sandbox). Only meaningful when not ReadOnly.
	Destructive bool `json:"destructive"`
	// Idempotent: calling it again with the same arguments has no further
	// effect.
	Idempotent bool `json:"idempotent"`
}

// opHints are the hints of the mutating operations; every observability
// operation, and the reads listed in readOps, are read-only and idempotent.
var opHints = map[string]Hints{
	"create_sandbox":             {},
	"destroy_sandbox":            {Destructive: true, Idempotent: true},
	"squash_layerstacks":         {Idempotent: true},
	"export_changes":             {Destructive: true, Idempotent: true}, // dir format overwrites host files
	"exec_command":               {Destructive: true},                   // runs arbitrary shell
	"write_command_stdin":        {},
	"cancel_command":             {Destructive: true, Idempotent: true},
	"resize_command":             {Idempotent: true},
	"file_write":                 {Destructive: true, Idempotent: true},
	"file_edit":                  {Destructive: true},
	"file_upload":                {Destructive: true, Idempotent: true},
	"file_download":              {ReadOnly: true, Idempotent: true},
	"file_delete":                {Destructive: true, Idempotent: true},
	"file_move":                  {Destructive: true},
	"create_workspace_session":   {},
	"destroy_workspace_session":  {Destructive: true, Idempotent: true},
	"publish_workspace_session":  {},
	"refresh_workspace_session":  {},
	"recover_workspace_session":  {Idempotent: true},
	"list_docker_images":         {ReadOnly: true, Idempotent: true},
	"list_workspace_directories": {ReadOnly: true, Idempotent: true},
	"list_sandboxes":             {ReadOnly: true, Idempotent: true},
	"inspect_sandbox":            {ReadOnly: true, Idempotent: true},
	"read_command_lines":         {ReadOnly: true, Idempotent: true},
	"file_read":                  {ReadOnly: true, Idempotent: true},
	"file_list":                  {ReadOnly: true, Idempotent: true},
	"file_search":                {ReadOnly: true, Idempotent: true},
	"file_blame":                 {ReadOnly: true, Idempotent: true},
	"list_workspace_sessions":    {ReadOnly: true, Idempotent: true},
	"diff_workspace_session":     {ReadOnly: true, Idempotent: true},
	"check_publish":              {ReadOnly: true, Idempotent: true},
	"pause_sandbox":              {Destructive: true, Idempotent: true}, // running commands end
	"resume_sandbox":             {Idempotent: true},
	"list_archived_sessions":     {ReadOnly: true, Idempotent: true},
	"restore_workspace_session":  {},
}

// Hints returns the operation's behaviour hints. Observability operations
// are read-only; an operation with no entry is treated as mutating and not
// idempotent (the safe default for a client deciding whether to confirm).
func (o *Operation) Hints() Hints {
	if h, ok := opHints[o.Name]; ok {
		return h
	}
	if o.Group == GroupObservability {
		return Hints{ReadOnly: true, Idempotent: true}
	}
	return Hints{}
}
