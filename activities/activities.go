package activities

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.temporal.io/sdk/activity"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/hostdir"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// Paths inside the sandbox container. The daemon's defaults match them
// (sandboxinit.Config: state dir /eos, token <state>/secret/daemon.token,
// RPC on :7001, layer store <state>/layerstack).
const (
	DaemonPath   = "/usr/local/lib/eos/sandbox-daemon"
	SessinitPath = "/usr/local/lib/eos/sandbox-sessinit" // next to the daemon, which finds it there
	StateDir     = "/eos"
	TokenPath    = "/eos/secret/daemon.token"
	ImportDir    = "/eos/import/src"
	DaemonPort   = 7001
	manifestPath = "/eos/layerstack/manifest.json"
)

// sandboxCaps is the capability set of a sandbox container on top of
// --cap-drop ALL (see the libcontainer probe's findings: SYS_ADMIN,
// DAC_OVERRIDE, SYS_CHROOT, SETUID, SETGID and SETPCAP are what nested
// sessions need; the rest is what sessions may keep).
var sandboxCaps = []string{
	"SYS_ADMIN", "DAC_OVERRIDE", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "NET_ADMIN",
	"CHOWN", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP",
}

// Docker is the narrow part of github.com/docker/docker/client the
// activities use; unit tests fake it.
type Docker interface {
	ImageInspect(ctx context.Context, imageID string, opts ...client.ImageInspectOption) (image.InspectResponse, error)
	ImageList(ctx context.Context, options image.ListOptions) ([]image.Summary, error)

	VolumeCreate(ctx context.Context, options volume.CreateOptions) (volume.Volume, error)
	VolumeInspect(ctx context.Context, volumeID string) (volume.Volume, error)
	VolumeList(ctx context.Context, options volume.ListOptions) (volume.ListResponse, error)
	VolumeRemove(ctx context.Context, volumeID string, force bool) error

	NetworkCreate(ctx context.Context, name string, options network.CreateOptions) (network.CreateResponse, error)
	NetworkInspect(ctx context.Context, networkID string, options network.InspectOptions) (network.Inspect, error)
	NetworkList(ctx context.Context, options network.ListOptions) ([]network.Summary, error)
	NetworkRemove(ctx context.Context, networkID string) error

	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig, networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, containerName string) (container.CreateResponse, error)
	ContainerInspect(ctx context.Context, containerID string) (container.InspectResponse, error)
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerStart(ctx context.Context, containerID string, options container.StartOptions) error
	ContainerStop(ctx context.Context, containerID string, options container.StopOptions) error
	ContainerRemove(ctx context.Context, containerID string, options container.RemoveOptions) error
	ContainerStats(ctx context.Context, containerID string, stream bool) (container.StatsResponseReader, error)
	ContainerStatsOneShot(ctx context.Context, containerID string) (container.StatsResponseReader, error)
	ContainerLogs(ctx context.Context, containerID string, options container.LogsOptions) (io.ReadCloser, error)

	CopyToContainer(ctx context.Context, containerID, dstPath string, content io.Reader, options container.CopyToContainerOptions) error
	CopyFromContainer(ctx context.Context, containerID, srcPath string) (io.ReadCloser, container.PathStat, error)

	ServerVersion(ctx context.Context) (types.Version, error)
	DiskUsage(ctx context.Context, options types.DiskUsageOptions) (types.DiskUsage, error)
}

var _ Docker = (*client.Client)(nil)

// NewDockerClient connects to the Docker Engine named by the environment
// (DOCKER_HOST, ...) and negotiates the API version with it.
func NewDockerClient() (*client.Client, error) {
	return client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
}

// Config configures the activities.
type Config struct {
	DaemonBinary   string // host path of the static sandbox-daemon copied into every sandbox
	SeccompProfile string // JSON text of the sandbox seccomp profile (the caller reads the file)
	Secret         []byte // gateway secret; daemon tokens are derived from it (DaemonToken)
	WorkerID       string // value of the eos.worker label
	// HostPaths is the rule for the host paths a caller names (the
	// workspace copied in, an export's destination); nil = the invoking
	// user's home and the current directory (hostpath.DefaultRoots).
	HostPaths *hostpath.Policy
	Logger    *slog.Logger
}

// Activities holds what the activities share: the Docker client, the
// configuration and one keep-alive HTTP client for every daemon. Every
// exported method is a Temporal activity.
type Activities struct {
	cfg    Config
	docker Docker
	log    *slog.Logger
	daemon *daemonclient.Client

	daemonArgs []string // SetDaemonArgs
	dvol       daemonVolumes
	pf         prefetches // workspace tars packed during a create (prefetch.go)

	ownerMu   sync.RWMutex
	cluster   string // the Temporal cluster id (SetOwner)
	ns        string // the Temporal namespace
	hostQueue string // this host's task queue (SetHostQueue)

	// The cluster's hosts (SetHostRegistry), and a daemon client for the
	// daemons of the others, reached through their forwarders.
	registry hostdir.Querier
	hosts    hostdir.Directory
	remote   *daemonclient.Client
	// unreachable holds the forwarders this worker could not dial, until
	// when their calls fall back at once (callOtherHost).
	unreachable sync.Map // address -> time.Time
}

// SetHostRegistry lets a's local daemon calls reach a sandbox of another
// host through that host's forwarder (CallDaemonHere), as the registry q
// describes the hosts.
func SetHostRegistry(a *Activities, q hostdir.Querier) {
	a.ownerMu.Lock()
	defer a.ownerMu.Unlock()
	a.registry = q
}

func (a *Activities) hostRegistry() hostdir.Querier {
	a.ownerMu.RLock()
	defer a.ownerMu.RUnlock()
	return a.registry
}

// SetHostQueue records the task queue of the host whose worker runs a.
func SetHostQueue(a *Activities, q string) {
	a.ownerMu.Lock()
	defer a.ownerMu.Unlock()
	a.hostQueue = q
}

// HostQueueOf is what SetHostQueue recorded.
func HostQueueOf(a *Activities) string {
	a.ownerMu.RLock()
	defer a.ownerMu.RUnlock()
	return a.hostQueue
}

// SetOwner records the Temporal cluster and namespace whose workflows use
// a's activities; new objects are labelled with them. (A function, not a
// method: every exported method of *Activities is an activity.)
func SetOwner(a *Activities, clusterID, namespace string) {
	a.ownerMu.Lock()
	defer a.ownerMu.Unlock()
	a.cluster, a.ns = clusterID, namespace
}

// owner is the cluster and namespace SetOwner recorded.
func (a *Activities) owner() (clusterID, namespace string) {
	a.ownerMu.RLock()
	defer a.ownerMu.RUnlock()
	return a.cluster, a.ns
}

// New builds the activities over a Docker client.
func New(cfg Config, docker Docker) *Activities {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.HostPaths == nil {
		cfg.HostPaths = hostpath.Default()
	}
	a := &Activities{cfg: cfg, docker: docker, log: log.With("component", "activities")}
	a.daemon = daemonclient.New(cfg.Secret, a.resolveDaemon)
	// Another host's daemon is looked up by its forwarder, not in this
	// host's Docker: no resolver.
	a.remote = daemonclient.New(cfg.Secret, nil, daemonclient.DialTimeout(forwarderDialTimeout))
	return a
}

func (a *Activities) token(sandboxID string) string {
	return daemonclient.Token(a.cfg.Secret, sandboxID)
}

// heartbeatEvery is how often a running activity heartbeats: well inside
// the 6 s heartbeat timeout of the workflows' options, so a worker that
// died mid-step is noticed, and the step retried, within seconds.
const heartbeatEvery = 2 * time.Second

// keepHeartbeating heartbeats every interval until the returned stop is
// called; progress (optional) supplies the details.
func keepHeartbeating(ctx context.Context, every time.Duration, progress func() any) (stop func()) {
	if !activity.IsActivity(ctx) {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if progress != nil {
					activity.RecordHeartbeat(ctx, progress())
				} else {
					activity.RecordHeartbeat(ctx)
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// Non-retryable failures.

// hostPathError is a refused host path: a non-retryable invalid_request
// naming the rule.
func hostPathError(err error) error { return apperr.New(hostpath.Refusal(err)) }

func invalidArgument(format string, a ...any) error {
	return apperr.Newf(api.KindInvalidRequest, nil, format, a...)
}

func notFound(format string, a ...any) error {
	return apperr.Newf(api.KindNotFound, nil, format, a...)
}

// conflict: a name or destination is taken by something that is not ours.
func conflict(format string, a ...any) error {
	return apperr.Newf(api.KindInvalidRequest, nil, format, a...)
}
