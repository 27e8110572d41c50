package activities

import "github.com/ephemeral-sandbox/sandbox/workflows"

// Labels every Docker object of ours carries. The reconciler finds leftovers
// by them; the daemon token never goes into labels.
const (
	LabelManaged   = "eos.managed"    // "true"
	LabelSandboxID = "eos.sandbox_id" // the sandbox id
	LabelRole      = "eos.role"       // "sandbox" (container), "state" (volume)
	LabelWorker    = "eos.worker"     // the worker (host) that owns it
	// The Temporal cluster and namespace whose workflow made the object:
	// the reconciler acts only on objects of its own deployment.
	LabelCluster   = "eos.temporal_cluster"
	LabelNamespace = "eos.temporal_namespace"
	// What adopting an orphan needs to recreate its workflow.
	LabelImage         = "eos.image"
	LabelWorkspaceRoot = "eos.workspace_root"
)

// ContainerStats is a snapshot of the sandbox container's resource use.
type ContainerStats struct {
	CPUPercent  float64 `json:"cpu_percent"`
	MemoryBytes uint64  `json:"memory_bytes"`
	MemoryLimit uint64  `json:"memory_limit"`
	Pids        uint64  `json:"pids"`
}

// Leftover is a Docker object with our labels.
type Leftover struct {
	Kind      string `json:"kind"` // container, network, volume
	Name      string `json:"name"`
	SandboxID string `json:"sandbox_id"`
}

// InspectResult is Inspect's answer: whether the sandbox's container
// exists and, if it does, its description.
type InspectResult struct {
	Exists    bool                    `json:"exists"`
	Container workflows.ContainerInfo `json:"container"`
}

// LabelBaseVolume names the shared base volume a sandbox container mounts.
const LabelBaseVolume = "eos.base_volume"
