package workflows

import (
	"encoding/json"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// The activities the workflows run, by their registered names (package
// activities implements them on the host's worker; the workflows and the
// gateway know them only by name and by the types below, so neither links
// the Docker client).
const (
	ActCheckImage      = "CheckImage"
	ActCreateVolume    = "CreateVolume"
	ActPrepareSandbox  = "PrepareSandbox"
	ActCreateContainer = "CreateContainer"
	ActCopyWorkspace   = "CopyWorkspace"
	ActImportWorkspace = "ImportWorkspace"
	ActStartContainer  = "StartContainer"
	ActWaitReady       = "WaitReady"
	ActRemoveSandbox   = "RemoveSandbox"
	ActStopContainer   = "StopContainer"
	ActCallDaemon      = "CallDaemon"
	ActCallDaemonHere  = "CallDaemonHere"
	ActResolveDaemon   = "ResolveDaemon"
	ActExportChanges   = "ExportChanges"
	ActPass            = "Pass"
	// Reads of a Docker host (HostOpWorkflow).
	ActListImages      = "ListImages"
	ActListDirectories = "ListDirectories"
	ActDockerVersion   = "DockerVersion"
	ActUsage           = "Usage"
	ActListSandboxes   = "ListSandboxObjects"
)

// SandboxSpec is everything needed to create one sandbox's Docker objects.
// It is deterministic (derived from workflow input), so a retried activity
// creates the same names.
type SandboxSpec struct {
	SandboxID     string          `json:"sandbox_id"`
	Image         string          `json:"image"`
	WorkspaceRoot string          `json:"workspace_root"` // host directory imported as the base
	ImportAll     bool            `json:"import_all,omitempty"`
	Profile       ResourceProfile `json:"profile"`
	// SharedBase mounts a base volume shared by a group of sandboxes
	// (create_sandbox with count > 1) at the layer store's base/.
	SharedBase *SharedBase       `json:"shared_base,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// PrefetchWorkspace, on CreateContainer's input only, says a streamed
	// import follows: the worker packs the workspace while Docker makes
	// and starts the container (activities/prefetch.go).
	PrefetchWorkspace bool `json:"prefetch_workspace,omitempty"`
}

// ResourceProfile limits the sandbox container.
type ResourceProfile struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	PidsLimit   int64   `json:"pids_limit,omitempty"`
}

// ContainerName and VolumeName are the deterministic Docker names of a sandbox.
func ContainerName(sandboxID string) string { return "eos-sbx-" + sandboxID }
func VolumeName(sandboxID string) string    { return "eos-state-" + sandboxID }

// ContainerInfo describes a created sandbox container.
type ContainerInfo struct {
	ContainerID string       `json:"container_id"`
	Name        string       `json:"name"`
	Volume      string       `json:"volume"`
	Daemon      api.Endpoint `json:"daemon"`
	// DaemonDirect is the daemon's address on the container's network,
	// which a caller on the same machine dials instead of Docker's proxy
	// (daemonclient/direct.go); nil for records made before it.
	DaemonDirect *api.Endpoint `json:"daemon_direct,omitempty"`
	Adopted      bool          `json:"adopted"`         // an existing container of the same name was reused
	State        string        `json:"state,omitempty"` // Docker's status: created, running, exited, ...
}

// DaemonCall is one RPC to a sandbox's daemon. The activity derives the
// daemon token from the gateway secret and the sandbox id itself, so the
// token never appears in workflow history.
type DaemonCall struct {
	SandboxID string          `json:"sandbox_id"`
	Daemon    api.Endpoint    `json:"daemon"`
	Op        string          `json:"op"`
	Args      json.RawMessage `json:"args,omitempty"`
	RequestID string          `json:"request_id,omitempty"` // idempotency key / trace id, derived by the workflow
	Timeout   time.Duration   `json:"timeout,omitempty"`
	// HostQueue is the sandbox's host queue: a local call (CallDaemonHere)
	// runs only on that host's worker.
	HostQueue string `json:"host_queue,omitempty"`
	// Direct is the daemon's address on its container's network (the
	// record's DaemonDirect), tried before Docker's proxy.
	Direct *api.Endpoint `json:"direct,omitempty"`
}

// ExportSpec exports a sandbox's published changes to the host.
type ExportSpec struct {
	SandboxID string       `json:"sandbox_id"`
	Daemon    api.Endpoint `json:"daemon"`
	Dest      string       `json:"dest"`   // absolute host path
	Format    string       `json:"format"` // dir (default), tar, tar-zst, patch, git
	Branch    string       `json:"branch,omitempty"`
	Force     bool         `json:"force,omitempty"`
	// WorkspaceRoot (format git): the sandbox's workspace_root, the one
	// dest the published paths are relative to.
	WorkspaceRoot string `json:"workspace_root,omitempty"`
	// GitParent (format git): the commit the workspace was copied from.
	GitParent string `json:"git_parent,omitempty"`
}

// ImageInfo is one entry of list_docker_images.
type ImageInfo struct {
	ID      string   `json:"id"`
	Tags    []string `json:"tags"`
	Size    int64    `json:"size"`
	Created int64    `json:"created"`
}

// CopyReport is what CopyWorkspace streamed into the container.
type CopyReport struct {
	Files    int   `json:"files"`
	Dirs     int   `json:"dirs"`
	Symlinks int   `json:"symlinks"`
	Bytes    int64 `json:"bytes"`
	// Skipped counts FIFOs, sockets and device nodes, which are not copied;
	// SkippedPaths lists the first few of them (relative to the root).
	Skipped      int      `json:"skipped"`
	SkippedPaths []string `json:"skipped_paths,omitempty"`
	// GitHead is the root's git HEAD commit at the copy ("" = none).
	GitHead string `json:"git_head,omitempty"`
}

// ImportWorkspaceInput names the workspace a new sandbox's daemon imports
// as its base, streamed by the host's worker (ImportWorkspace).
type ImportWorkspaceInput struct {
	Spec      SandboxSpec `json:"spec"`
	RequestID string      `json:"request_id,omitempty"`
}

// ImportWorkspaceResult is what the host sent (the copy's counts and git
// head) and the base the daemon made of it.
type ImportWorkspaceResult struct {
	Copy CopyReport         `json:"copy"`
	Base api.InitBaseResult `json:"base"`
}

// SharedBase is the base volume of a group of sandboxes created together.
// The leader imports the workspace into it (read-write); the others mount it
// read-only and initialise from the leader's base id.
type SharedBase struct {
	Volume string `json:"volume"`
	Leader bool   `json:"leader"`
}

// BaseVolumeName is the shared base volume of a group led by leaderID.
func BaseVolumeName(leaderID string) string { return "eos-base-" + leaderID }

// ContainerUsage is one reading of a sandbox container's counters (the
// seed's host-ring sample).
type ContainerUsage struct {
	SampledAtUnixMS    int64  `json:"sampled_at_unix_ms"`
	CPUUsageUsec       uint64 `json:"cpu_usage_usec"`
	MemoryCurrentBytes uint64 `json:"memory_current_bytes"`
	MemoryLimitBytes   uint64 `json:"memory_limit_bytes"`
	Pids               uint64 `json:"pids"`
	IOReadBytes        uint64 `json:"io_read_bytes"`
	IOWriteBytes       uint64 `json:"io_write_bytes"`
}

// DirectoryEntry is one directory of list_workspace_directories.
type DirectoryEntry struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// DirectoryListing is list_workspace_directories' answer: the directories
// under Path on the sandbox host (Path "": the home directory).
type DirectoryListing struct {
	Path        string           `json:"path"`
	Parent      *string          `json:"parent"`
	Truncated   bool             `json:"truncated"`
	Directories []DirectoryEntry `json:"directories"`
}

// HostOp is a read of a Docker host, run as an activity on the host's
// worker (HostOpWorkflow): the gateway never talks to Docker itself.
type HostOp struct {
	Op         string   `json:"op"` // one of the HostOp* constants
	Queue      string   `json:"queue,omitempty"`
	Path       string   `json:"path,omitempty"`
	SandboxIDs []string `json:"sandbox_ids,omitempty"`
}

// Host reads.
const (
	HostOpImages      = "list_docker_images"
	HostOpDirectories = "list_workspace_directories"
	HostOpVersion     = "docker_version"
	HostOpUsage       = "container_usage"
	HostOpSandboxes   = "list_sandbox_objects"
	HostOpRemove      = "remove_sandbox" // an orphan's container and volume, asked for explicitly
)

// HostOpResult holds the one field of its read.
type HostOpResult struct {
	Images      []ImageInfo               `json:"images,omitempty"`
	Directories *DirectoryListing         `json:"directories,omitempty"`
	Version     string                    `json:"version,omitempty"`
	Usage       map[string]ContainerUsage `json:"usage,omitempty"`
	UsageErrors map[string]*api.Error     `json:"usage_errors,omitempty"`
	Sandboxes   []SandboxObjects          `json:"sandboxes,omitempty"`
}

// SandboxObjects are the Docker objects of one sandbox on a host, as the
// reconciler and list_orphaned_sandboxes see them.
type SandboxObjects struct {
	SandboxID      string    `json:"sandbox_id"`
	Container      string    `json:"container,omitempty"`
	ContainerState string    `json:"container_state,omitempty"` // running, exited, ... ("" = no container)
	Volume         string    `json:"volume,omitempty"`
	VolumeBytes    int64     `json:"volume_bytes"` // -1 when Docker did not say
	Created        time.Time `json:"created"`
	Image          string    `json:"image,omitempty"`
	WorkspaceRoot  string    `json:"workspace_root,omitempty"`
	// The Temporal cluster and namespace that made them ("" for objects
	// made before they were labelled).
	Cluster   string `json:"temporal_cluster,omitempty"`
	Namespace string `json:"temporal_namespace,omitempty"`
	Worker    string `json:"worker,omitempty"`
}
