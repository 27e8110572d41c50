package workflows

import "fmt"

// Registered names: stable, never renamed (histories refer to them).
const (
	TaskQueue           = "eos-sandboxes"
	SandboxWorkflowName = "eos.SandboxWorkflow"
	PublishWorkflowName = "eos.PublishWorkflow"
	// HostOpWorkflowName reads a Docker host (HostOpWorkflow).
	HostOpWorkflowName = "eos.HostOpWorkflow"
)

// Updates, queries and signals of SandboxWorkflow. Update names are the
// catalog's operation names.
const (
	UpdateWaitReady      = "wait_ready"
	UpdateCreateSession  = "create_workspace_session"
	UpdateDestroySession = "destroy_workspace_session"
	UpdatePublish        = "publish_workspace_session"
	UpdateRefresh        = "refresh_workspace_session"
	UpdateAmend          = "amend"
	UpdateSquash         = "squash_layerstacks"
	UpdateExport         = "export_changes"
	UpdateDestroy        = "destroy_sandbox"
	// UpdateResolveDaemon looks up where the sandbox's daemon listens now
	// (a restarted container may be published on another host port) and
	// records it.
	UpdateResolveDaemon = "resolve_daemon"
	QueryState          = "state"
	QueryLastPublish    = "last_publish" // the latest publish's record (the memo may lag it by up to a second)
	// QueryPublishProgress is PublishWorkflow's query: the step it is in.
	QueryPublishProgress = "progress"
	SignalContainerLost  = "container_lost"
)

// Sandbox phases (the seed's states).
const (
	PhaseCreating = "creating"
	PhaseReady    = "ready"
	PhaseStopping = "stopping"
	PhaseStopped  = "stopped"
	PhaseFailed   = "failed"
)

// SandboxWorkflowID is the workflow id of a sandbox, and its idempotency key.
func SandboxWorkflowID(sandboxID string) string { return "sandbox/" + sandboxID }

// PublishWorkflowID names the seq-th publish of a session; it is also the
// publish's transaction id at the layer store.
func PublishWorkflowID(sandboxID, sessionID string, seq int) string {
	return fmt.Sprintf("publish/%s/%s/%d", sandboxID, sessionID, seq)
}
