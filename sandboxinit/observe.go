package sandboxinit

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// observability is the daemon's side of observability: the store on the
// state volume, the sampler that only runs while the sandbox is active, and
// the commands running now.
type observability struct {
	store   *telemetry.Store
	sampler *telemetry.Sampler
	execs   executions

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
	st, err := telemetry.Open(filepath.Join(d.cfg.StateDir, "observability"), telemetry.Options{
		EventBudget: d.cfg.EventBudget, SampleBudget: d.cfg.SampleBudget})
	if err != nil {
		return fmt.Errorf("observability store: %w", err)
	}
	d.obs = &observability{store: st, prevCPU: map[string]cpuPoint{}}
	d.obs.sampler = telemetry.NewSampler(telemetry.SamplerOptions{Interval: d.cfg.SampleInterval, IdleAfter: d.cfg.SampleIdleAfter,
		Busy: func() bool { return d.obs.execs.count() > 0 }, Collect: d.collect})
	return nil
}

func (d *Daemon) closeObservability() error {
	d.obs.sampler.Close()
	return d.obs.store.Close()
}

// span starts a span under the one in ctx.
func (d *Daemon) span(ctx context.Context, name string, attrs map[string]any) (context.Context, *telemetry.ActiveSpan) {
	return d.obs.store.Tracer.Start(ctx, name, attrs)
}

// event records a daemon event in the trace of ctx and logs it.
func (d *Daemon) event(ctx context.Context, name string, attrs map[string]any) {
	d.obs.store.Tracer.Event(ctx, name, attrs)
	d.log.Info(name, "trace", telemetry.TraceID(ctx), "attrs", attrs)
}

// touch is activity: the sampler wakes up (or stays awake).
func (d *Daemon) touch() { d.obs.sampler.Touch() }
