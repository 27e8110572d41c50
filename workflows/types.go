package workflows

import (
	"encoding/json"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// SandboxInput starts (or continues) a sandbox.
type SandboxInput struct {
	Spec SandboxSpec `json:"spec"`
	// HostQueue is the task queue of the worker on the Docker host that owns
	// the sandbox; its activities run there ("" = TaskQueue).
	HostQueue string `json:"host_queue,omitempty"`
	// SessionTTL reaps sessions idle for longer (0 = never).
	SessionTTL time.Duration `json:"session_ttl,omitempty"`
	// SandboxTTL pauses the sandbox this long after creation or its last
	// resume (0 = never; lifecycle_ttl.go).
	SandboxTTL time.Duration `json:"sandbox_ttl,omitempty"`
	// BaseID is the shared base a group follower initialises from (the
	// leader's, see SharedBase).
	BaseID string `json:"base_id,omitempty"`
	// Adopt recreates the workflow of an orphaned sandbox over its existing
	// state volume: no workspace copy, the store and its sessions as they
	// are.
	Adopt bool `json:"adopt,omitempty"`
	// Standby starts the sandbox empty and unlisted, to wait StandbyTTL
	// (0 = DefaultStandbyTTL) for a create_sandbox to claim it
	// (standby.go); Spec then holds only its id and image.
	Standby    bool          `json:"standby,omitempty"`
	StandbyTTL time.Duration `json:"standby_ttl,omitempty"`
	// State is set when the workflow continues as new.
	State *SandboxState `json:"state,omitempty"`
}

// SandboxState is the durable state of a sandbox (query "state").
type SandboxState struct {
	SandboxID  string                    `json:"sandbox_id"`
	Phase      string                    `json:"state"`
	BaseID     string                    `json:"base_id,omitempty"`
	Container  ContainerInfo             `json:"container"`
	Sessions   map[string]*SessionRecord `json:"sessions"`
	Archived   []ArchivedSession         `json:"archived_sessions,omitempty"`
	PublishSeq int                       `json:"publish_seq"`
	// PublishQueue holds the verified publishes waiting or running, in
	// order.
	PublishQueue []*QueuedPublish `json:"publish_queue,omitempty"`
	Publishes    int              `json:"publishes"`
	Error        string           `json:"error,omitempty"`
	// Failure is why creation failed, as the step that failed said it.
	Failure *api.Error `json:"failure,omitempty"`
	Created time.Time  `json:"created"`
	// Standby: a standby nobody claimed yet (standby.go); list_sandboxes
	// and the fleet views leave it out.
	Standby bool `json:"standby,omitempty"`
	// Claiming: a spare checks the image of a claim it has not taken yet
	// (standby.go): in a moment it is claimed, or a standby again.
	Claiming bool `json:"claiming,omitempty"`
	Runs     int  `json:"runs"`
	// HostQueue is the task queue of the sandbox's host (SandboxInput's;
	// "" = the shared queue, a single-host deployment).
	HostQueue string `json:"host_queue,omitempty"`
	// Lifecycle holds the TTLs and the pause state (lifecycle_ttl.go).
	Lifecycle *LifecycleState `json:"lifecycle,omitempty"`

	// SharedRootHash is the base's root hash when the sandbox shares it
	// with others created together (create_sandbox count): the same in
	// every record of the group.
	SharedRootHash string `json:"shared_root_hash,omitempty"`
	// GitHead is the commit HEAD named in workspace_root's repository when
	// the workspace was copied ("" = not a git work tree): a git export's
	// parent.
	GitHead string `json:"git_head,omitempty"`
}

// SessionRecord is what the workflow knows of a workspace session.
type SessionRecord struct {
	ID             string    `json:"workspace_session_id"`
	NetworkProfile string    `json:"network_profile"`
	Agent          string    `json:"agent,omitempty"`
	Created        time.Time `json:"created"`
}

// ArchivedSession is a reaped idle session whose unpublished changes were
// kept on the state volume.
type ArchivedSession = api.ArchivedSession

// SandboxResult is the final state of a sandbox workflow.
type SandboxResult struct {
	SandboxID string `json:"sandbox_id"`
	Phase     string `json:"state"`
	Error     string `json:"error,omitempty"`
}

// CreateSessionRequest is the create_workspace_session update's argument.
type CreateSessionRequest struct {
	NetworkProfile string          `json:"network_profile,omitempty"`
	Agent          string          `json:"agent,omitempty"`
	Limits         json.RawMessage `json:"limits,omitempty"`
	// Egress is passed to the daemon as given ("default", "none" or
	// ["cidr:port", ...]); the daemon validates it.
	Egress json.RawMessage `json:"egress,omitempty"`
	// From: fork this session (the daemon checks it).
	From string `json:"from,omitempty"`
}

// SessionRequest names a session (destroy, refresh).
type SessionRequest struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
	GraceS             *int   `json:"grace_s,omitempty"`
	Force              bool   `json:"force,omitempty"`
}

// PublishRequest is the publish_workspace_session update's argument.
type PublishRequest struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
	Keep               bool   `json:"keep,omitempty"`
	Message            string `json:"message,omitempty"`
	// Verify makes it a verified publish (api.PublishVerify): queued behind
	// the sandbox's other verified publishes, committed only if the command
	// passes on the would-be head. VerifyTimeoutS and VerifyRetries apply
	// to it (nil: the defaults; ignored without Verify).
	Verify         *string `json:"verify,omitempty"`
	VerifyTimeoutS *int64  `json:"verify_timeout_s,omitempty"`
	VerifyRetries  *int64  `json:"verify_retries,omitempty"`
}

// QueuedPublish is one verified publish in the sandbox's queue (the
// snapshot's publish_queue): they run one at a time in the order the
// workflow accepted them.
type QueuedPublish struct {
	WorkspaceSessionID string     `json:"workspace_session_id"`
	TxID               string     `json:"txid"`
	UpdateID           string     `json:"update_id,omitempty"`
	Position           int        `json:"position"` // 1 = running
	State              string     `json:"state"`    // queued, verifying
	EnqueuedAt         time.Time  `json:"enqueued_at"`
	StartedAt          *time.Time `json:"started_at,omitempty"`
}

// AmendRequest is a sessionless file_write / file_edit / file_delete /
// file_move, committed as one layer under the sandbox's commit mutex.
type AmendRequest struct {
	Op   string          `json:"op"` // file_write, file_edit, file_delete, file_move
	Args json.RawMessage `json:"args"`
}

// ExportRequest is the export_changes update's argument.
type ExportRequest struct {
	Dest   string `json:"dest"`
	Format string `json:"format,omitempty"`
	Branch string `json:"branch,omitempty"` // format git only
	Force  bool   `json:"force,omitempty"`  // format git: move a branch that is not an ancestor
}

// PublishInput is PublishWorkflow's input. TxID is the workflow's own id.
type PublishInput struct {
	SandboxID string       `json:"sandbox_id"`
	HostQueue string       `json:"host_queue,omitempty"`
	Daemon    api.Endpoint `json:"daemon"`
	SessionID string       `json:"workspace_session_id"`
	TxID      string       `json:"txid"`
	Keep      bool         `json:"keep,omitempty"`
	Message   string       `json:"message,omitempty"`
	// RequestID is the caller's request id (the update's id): the daemon
	// calls carry it, so trace(<request id>) shows the publish's steps.
	RequestID string `json:"request_id,omitempty"`
}

// PublishOutput is the daemon's finalize result (seed shape).
type PublishOutput = api.PublishFinalResult

// PublishProgress is what PublishWorkflow's progress query answers: the
// daemon step it runs (publish_prepare, publish_commit, publish_finalize,
// publish_abort) and, once prepared, how many paths the change set holds.
type PublishProgress struct {
	SessionID string `json:"workspace_session_id"`
	Step      string `json:"step"`
	Changes   int    `json:"changes,omitempty"`
}
