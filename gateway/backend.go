package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/api/serviceerror"
	tclient "go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/hostdir"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TemporalBackend serves the catalog: lifecycle ops as SandboxWorkflow
// updates (or, for the sandbox records, from Temporal's visibility and the
// workflows' state), host-scoped reads as activities on the host's worker,
// and runtime ops straight on the sandbox's daemon through the one daemon
// client. It never talks to Docker: a gateway on another machine than the
// sandboxes works the same.
type TemporalBackend struct {
	Client    tclient.Client
	HostQueue string        // the task queue of the worker owning new sandboxes ("" = workflows.TaskQueue)
	Secret    []byte        // the deployment secret daemon tokens derive from
	Timeout   time.Duration // per lifecycle update (default 10 minutes)
	Namespace string        // Temporal namespace, for UI links ("" = default)
	UIAddress string        // Temporal UI host:port or base URL, for links ("" = no links)
	// HostPaths is the rule for workspace_root and export dests, checked
	// before a workflow starts (nil = hostpath.Default()). The activities
	// check again with their own.
	HostPaths *hostpath.Policy
	// FleetConcurrency and FleetTimeout bound the system-wide views'
	// fan-out to the sandboxes (defaults 8 and 1.5 s per sandbox).
	FleetConcurrency int
	FleetTimeout     time.Duration
	// DefaultSandboxTTL and DefaultSessionIdleTTL apply to create_sandbox
	// calls without ttl / session_idle_ttl (0 = off).
	DefaultSandboxTTL, DefaultSessionIdleTTL time.Duration

	// LocalQueue is the host queue of this process's own workers ("" =
	// none: --no-workers, every host is remote), LocalName its host name.
	LocalQueue, LocalName string

	// Standby keeps a started, empty sandbox per image and host for the
	// next create_sandbox to claim (standby.go; the zero value is off).
	Standby StandbyOptions
	// Log receives what goes wrong in the background (nil = slog.Default()).
	Log *slog.Logger

	once      sync.Once
	daemon    *daemonclient.Client
	mu        sync.Mutex
	endpoints map[string]api.Endpoint
	// directs holds each sandbox's direct daemon address with the published
	// endpoint it came with (records.go: rememberDirect).
	directs map[string][2]api.Endpoint
	queues  map[string]string // sandbox id -> its host's queue
	hostDir hostdir.Directory
	// copyHosts: per sandbox, the queue of the host whose forwarder served
	// its last state copy (records.go: hostCopy).
	copyHosts map[string]string
	placed    map[string][]time.Time // when this gateway placed sandboxes, per queue
	standby   *standbys
	// viewReads counts the views' reads of a sandbox's state by source
	// (viewState), when the server's metrics are set.
	viewReads atomic.Pointer[prometheus.CounterVec]
}

// countView counts one read of a sandbox's state for a view.
func (b *TemporalBackend) countView(source string) {
	if cv := b.viewReads.Load(); cv != nil {
		cv.WithLabelValues(source).Inc()
	}
}

func (b *TemporalBackend) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

// daemons is the daemon client, with a resolver that asks the sandbox's
// workflow where its daemon listens now.
func (b *TemporalBackend) daemons() *daemonclient.Client {
	b.once.Do(func() { b.daemon = daemonclient.New(b.Secret, b.resolveDaemon) })
	return b.daemon
}

func notFoundSandbox(id string) *api.Error {
	return api.Errorf(api.KindInvalidRequest, map[string]any{"sandbox_id": id}, "sandbox not found: %s", id) // the seed's kind
}

// mapErr is the one place a failure below the gateway becomes what the
// client is told: the *api.Error raised where the refusal happened (the
// daemon, an activity, the workflow), unchanged however deep Temporal
// wrapped it; a sandbox Temporal does not know is not_found.
func mapErr(sandboxID string, err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) && sandboxID != "" {
		return notFoundSandbox(sandboxID)
	}
	return apperr.Client(err)
}

func (b *TemporalBackend) timeout() time.Duration {
	if b.Timeout > 0 {
		return b.Timeout
	}
	return 10 * time.Minute
}

// update runs one SandboxWorkflow update and waits for its result; the
// request id is the update id, so a retried request joins the first.
func (b *TemporalBackend) update(ctx context.Context, sandboxID, name string, out any, args ...any) error {
	if sandboxID == "" {
		return api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	if err := b.checkHost(ctx, sandboxID); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout())
	defer cancel()
	var raw json.RawMessage // written only by the update's own goroutine
	if err := b.whileHostLive(ctx, sandboxID, func(ctx context.Context) error {
		return mapErr(sandboxID, lifecycle.Update(ctx, b.Client, sandboxID, name, RequestID(ctx), &raw, args...))
	}); err != nil {
		var lost errHostLost
		if errors.As(err, &lost) {
			if name == workflows.UpdateResolveDaemon { // the gateway's own look, not the caller's op
				return lost.error
			}
			return inFlight(lost.error)
		}
		return err
	}
	if out == nil || len(raw) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return api.Errorf(api.KindInternal, map[string]any{"sandbox_id": sandboxID, "op": name}, "decode the answer to %s: %v", name, err)
	}
	return nil
}

// submit runs an update the async way: it returns once the workflow
// accepted it.
func (b *TemporalBackend) submit(ctx context.Context, sandboxID, name string, args ...any) (any, error) {
	if sandboxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	if err := b.checkHost(ctx, sandboxID); err != nil {
		return nil, err
	}
	acc, err := lifecycle.UpdateAsync(ctx, b.Client, sandboxID, name, RequestID(ctx), args...)
	if err != nil {
		return nil, mapErr(sandboxID, err)
	}
	return acc, nil
}

// run is update, or submit when the call asked for async.
func (b *TemporalBackend) run(ctx context.Context, async bool, sandboxID, name string, args ...any) (any, error) {
	if async {
		return b.submit(ctx, sandboxID, name, args...)
	}
	var out json.RawMessage
	if err := b.update(ctx, sandboxID, name, &out, args...); err != nil {
		return nil, err
	}
	return out, nil
}

func isAsync(args map[string]any) bool {
	v, _ := args["async"].(bool)
	delete(args, "async")
	return v
}

// withArg returns args plus k=v, leaving the caller's map as it was.
func withArg(args map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(args)+1)
	for ak, av := range args {
		out[ak] = av
	}
	out[k] = v
	return out
}

func (b *TemporalBackend) hostPaths() *hostpath.Policy {
	if b.HostPaths == nil {
		return hostpath.Default()
	}
	return b.HostPaths
}
