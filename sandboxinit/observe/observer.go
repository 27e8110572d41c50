package observe

import (
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// Source is what the views and the sampler read of the daemon. The daemon
// implements it; nothing here changes the daemon through it.
type Source interface {
	// Sessions returns a snapshot of every live workspace session, in no
	// particular order.
	Sessions() []Session
	// Session returns a snapshot of one live session, or the daemon's
	// not_found error.
	Session(id string) (Session, error)
	// Layers is the sandbox's layer stack.
	Layers() *layerstack.Store
}

// Session is what a view may read of a workspace session: a snapshot the
// daemon takes without the session's gate (under the lock that guards the
// fields gate holders change), so reading it never races a publish.
type Session struct {
	ID             string
	NetworkProfile string
	Agent          string
	Implicit       bool
	Created        time.Time
	Idle           time.Duration // since the session was last used

	State             string           // the daemon's session state (lifecycle_state of samples)
	FinalizationState string           // the seed's finalization_state
	LeaseID           string           // the session's lease on the layer stack
	Upper             string           // the upper dir's path
	Runtime           *runtime.Session // nil while the session is not running
	Egress            *api.Egress      // an isolated session's egress policy (nil otherwise)
}

// Config is what the views show of the daemon's configuration, and the
// store's and sampler's settings (zero means the default).
type Config struct {
	StateDir  string    // the state volume: the store lives in observability/
	Listen    string    // the daemon's RPC address
	SandboxID string    // names the sandbox when a view's caller does not
	Started   time.Time // when the daemon started
	// IngressGuard is what the daemon view says of the sandbox's ingress
	// table (runtime.GuardIngress): state on, off (not asked for: not in
	// a sandbox's container) or unavailable (with the error).
	IngressGuard map[string]any

	EventBudget     int64
	SampleBudget    int64
	SampleInterval  time.Duration
	SampleIdleAfter time.Duration
}

// Observer is one daemon's observability: the store on the state volume,
// the sampler that only runs while the sandbox is active, the commands
// running now, and the views over them.
type Observer struct {
	Store   *telemetry.Store
	Sampler *telemetry.Sampler
	Running Executions

	src Source
	cfg Config

	// What the collectors remember between rounds, to turn cumulative CPU
	// counters into percentages and to write a stack sample only when the
	// manifest changed.
	mu        sync.Mutex
	prevCPU   map[string]cpuPoint
	stackSeen int64
}

type cpuPoint struct {
	at   time.Time
	usec uint64
}

// Open opens the store under cfg.StateDir and prepares the sampler (it
// starts on the first Touch).
func Open(cfg Config, src Source) (*Observer, error) {
	st, err := telemetry.Open(filepath.Join(cfg.StateDir, "observability"), telemetry.Options{
		EventBudget: cfg.EventBudget, SampleBudget: cfg.SampleBudget})
	if err != nil {
		return nil, fmt.Errorf("observability store: %w", err)
	}
	o := &Observer{Store: st, src: src, cfg: cfg, prevCPU: map[string]cpuPoint{}}
	o.Sampler = telemetry.NewSampler(telemetry.SamplerOptions{Interval: cfg.SampleInterval, IdleAfter: cfg.SampleIdleAfter,
		Busy: func() bool { return o.Running.Count() > 0 }, Collect: o.collect})
	return o, nil
}

// Close stops the sampler and closes the store.
func (o *Observer) Close() error {
	o.Sampler.Close()
	return o.Store.Close()
}
