package sandboxinit

import (
	"context"
	"fmt"
	"time"

	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/observe"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// The daemon's side of observability: it opens the observer (observe/) on
// the state volume, records spans and events, wakes the sampler, and lets
// the views and the sampler read it through observed.

// CheckObservability validates the observability settings against the
// seed's ranges (zero means the default).
func (c *Config) CheckObservability() error {
	switch {
	case c.EventBudget != 0 && (c.EventBudget < 1<<20 || c.EventBudget > 16<<20):
		return fmt.Errorf("observability budget %d: must be 1-16 MiB", c.EventBudget)
	case c.SampleBudget != 0 && (c.SampleBudget < 128<<10 || c.SampleBudget > 4<<20):
		return fmt.Errorf("samples budget %d: must be 128 KiB-4 MiB", c.SampleBudget)
	case c.SampleInterval != 0 && (c.SampleInterval < 250*time.Millisecond || c.SampleInterval > 10*time.Minute):
		return fmt.Errorf("sample interval %s: must be 250ms-10m", c.SampleInterval)
	}
	return nil
}

func (d *Daemon) openObservability() error {
	if d.ingress == nil {
		d.ingress = map[string]any{"state": "off"} // not asked for (New)
	}
	obs, err := observe.Open(observe.Config{StateDir: d.cfg.StateDir, Listen: d.cfg.Listen, SandboxID: d.cfg.SandboxID, Started: d.started, IngressGuard: d.ingress,
		EventBudget: d.cfg.EventBudget, SampleBudget: d.cfg.SampleBudget,
		SampleInterval: d.cfg.SampleInterval, SampleIdleAfter: d.cfg.SampleIdleAfter}, observed{d})
	if err != nil {
		return err
	}
	d.obs = obs
	return nil
}

func (d *Daemon) closeObservability() error { return d.obs.Close() }

// span starts a span under the one in ctx.
func (d *Daemon) span(ctx context.Context, name string, attrs map[string]any) (context.Context, *telemetry.ActiveSpan) {
	return d.obs.Store.Tracer.Start(ctx, name, attrs)
}

// event records a daemon event in the trace of ctx and logs it.
func (d *Daemon) event(ctx context.Context, name string, attrs map[string]any) {
	d.obs.Store.Tracer.Event(ctx, name, attrs)
	d.log.Info(name, "trace", telemetry.TraceID(ctx), "attrs", attrs)
}

// touch is activity: the sampler wakes up (or stays awake).
func (d *Daemon) touch() { d.obs.Sampler.Touch() }

// observed is the daemon as the views and the sampler read it
// (observe.Source). It takes no session's gate: sessions are snapshots
// taken under their seenMu.
type observed struct{ d *Daemon }

func (o observed) Sessions() []observe.Session {
	o.d.mu.Lock()
	live := make([]*session, 0, len(o.d.sessions))
	for _, s := range o.d.sessions {
		live = append(live, s)
	}
	o.d.mu.Unlock()
	out := make([]observe.Session, 0, len(live))
	for _, s := range live {
		out = append(out, s.snapshot())
	}
	return out
}

func (o observed) Session(id string) (observe.Session, error) {
	s, err := o.d.session(id)
	if err != nil {
		return observe.Session{}, err
	}
	return s.snapshot(), nil
}

func (o observed) Layers() *layerstack.Store { return o.d.store }

// Requests is what the daemon is serving now, for the daemon view.
func (o observed) Requests() map[string]any {
	return map[string]any{"in_flight": o.d.inflight.total(), "in_flight_ops": o.d.inflight.byOp()}
}

// WarmStats is the warm session's state for the daemon view.
func (o observed) WarmStats() map[string]any {
	d := o.d
	d.mu.Lock()
	defer d.mu.Unlock()
	w := &d.warm
	st := map[string]any{"enabled": d.cfg.WarmSessions > 0, "pool": d.cfg.WarmSessions, "ready": len(w.ready) > 0, "ready_count": len(w.ready),
		"building": w.building > 0, "builds_running": w.building, "built": w.built, "adopted": w.adopted, "discarded": w.discarded, "reheaded": w.reheaded,
		"waited": w.waited, "waited_ms": w.waitedFor.Milliseconds()}
	switch {
	case len(w.ready) > 0:
		st["manifest_version"] = w.ready[len(w.ready)-1].warmVersion
	case w.building > 0:
		st["manifest_version"] = w.version
	}
	return st
}

// snapshot is what a view may read of s without its gate. The record's
// other fields never change once the session is live.
func (s *session) snapshot() observe.Session {
	seen := s.seen()
	return observe.Session{ID: s.rec.ID, NetworkProfile: s.rec.NetworkProfile, Agent: s.rec.Agent, Implicit: s.rec.Implicit,
		Created: s.rec.Created, Idle: s.act.since(), State: seen.state, FinalizationState: finalizationState(seen.state),
		LeaseID: seen.leaseID, Upper: seen.upper, Runtime: seen.rt, Egress: s.egress()}
}

// finalizationState maps a session state to the seed's finalization_state.
func finalizationState(state string) string {
	switch state {
	case StateActive:
		return "active"
	case StatePublishing, StateFinalizing:
		return "finalizing"
	}
	return state
}
