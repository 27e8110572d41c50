package sandboxinit

import (
	"context"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// A warm session: one shared-network session per sandbox, started before
// anyone asks (namespaces, cgroup, seccomp, overlay mount, session init),
// that the next plain create_workspace_session adopts, which then only
// takes a lease and writes the session's record. It is mounted on the head
// it was started at, and a session must start on the head of its create,
// so a warm session is adopted only while the head has not moved; a
// newer head discards it. It is built when the head has been still for
// warmStable (a sandbox whose head moves every second — many agents
// publishing — builds none, so it costs nothing there), and again right
// after one was adopted.
//
// Until it is adopted it is not a session of the sandbox: it is in no
// list, holds no lease (the layers under its mount are the head's, which
// no commit removes; a squash or a later head makes it stale, and it is
// discarded before it could be adopted) and counts for no budget; a
// daemon that restarts removes it (its record says warm).
const (
	warmPoll   = 250 * time.Millisecond
	warmStable = time.Second
)

// warmPool is the daemon's warm session and its builder's state.
type warmPool struct {
	s        *session      // ready to adopt, or nil
	version  int64         // the manifest version s (or the build) is mounted on
	building bool          // a build runs
	done     chan struct{} // closed when the build ends
	kick     chan struct{} // a build is wanted now (one was adopted)
	cancel   context.CancelFunc
	// Counters, for the trace and the tests.
	built, adopted, discarded int
}

// warmEligible is whether a create may adopt the warm session: a plain
// create (no fork, the shared network, no limits, no egress policy).
func (d *Daemon) warmEligible(a api.CreateSessionArgs, implicit bool) bool {
	return d.cfg.WarmSessions > 0 && !implicit && a.From == "" && a.NetworkProfile == "shared" && a.Limits == nil && a.Egress == nil
}

// headVersion is the store's current manifest version, 0 before the base.
func (d *Daemon) headVersion() int64 {
	m, err := d.store.Manifest()
	if err != nil {
		return 0
	}
	return m.Version
}

// startWarm runs the builder until Close.
func (d *Daemon) startWarm() {
	if d.cfg.WarmSessions <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.mu.Lock()
	d.warm.kick = make(chan struct{}, 1)
	d.warm.cancel = cancel
	d.mu.Unlock()
	go d.runWarm(ctx)
}

// stopWarm stops the builder and removes a warm session that is ready.
func (d *Daemon) stopWarm(ctx context.Context) {
	d.mu.Lock()
	cancel, done, s := d.warm.cancel, d.warm.done, d.warm.s
	d.warm.s, d.warm.cancel = nil, nil
	d.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	if s != nil {
		_, _ = d.teardown(ctx, s, false)
	}
}

func (d *Daemon) runWarm(ctx context.Context) {
	t := time.NewTicker(warmPoll)
	defer t.Stop()
	last, since := int64(-1), time.Now()
	for {
		kicked := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.warm.kick:
			kicked = true
		}
		v := d.headVersion()
		if v != last {
			last, since = v, time.Now()
		}
		d.mu.Lock()
		if w := &d.warm; w.s != nil && w.version != v {
			stale := w.s
			w.s = nil
			w.discarded++
			go d.discardWarm(stale)
		}
		room := len(d.sessions)+d.creating+1 < d.cfg.MaxSessions
		build := d.warm.s == nil && !d.warm.building && v > 0 && room && (kicked || time.Since(since) >= warmStable)
		if build {
			d.warm.building, d.warm.version, d.warm.done = true, v, make(chan struct{})
		}
		d.mu.Unlock()
		if build {
			d.buildWarm(ctx, v)
		}
	}
}

// buildWarm starts the warm session on version v (in this goroutine: one
// build at a time).
func (d *Daemon) buildWarm(ctx context.Context, v int64) {
	s, err := d.createSessionAs(ctx, api.CreateSessionArgs{NetworkProfile: "shared"}, false, true)
	d.mu.Lock()
	done := d.warm.done
	d.warm.building = false
	switch {
	case err != nil:
		d.log.Warn("starting a warm session failed", "err", err)
	case s.warmVersion != v || ctx.Err() != nil:
		d.warm.discarded++
		go d.discardWarm(s)
	default:
		d.warm.s = s
		d.warm.built++
	}
	d.mu.Unlock()
	close(done)
}

// adoptWarm hands the warm session to a create, or returns nil (the create
// makes its session the usual way). A build in progress on the current head
// is waited for: it started earlier than a new create would.
func (d *Daemon) adoptWarm(ctx context.Context, a api.CreateSessionArgs) *session {
	head := d.headVersion()
	d.mu.Lock()
	if d.warm.building && d.warm.version == head {
		done := d.warm.done
		d.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil
		}
		d.mu.Lock()
	}
	s, v := d.warm.s, d.warm.version
	d.warm.s = nil
	d.mu.Unlock()
	if s == nil {
		return nil
	}
	discard := func() *session {
		d.mu.Lock()
		d.warm.discarded++
		d.mu.Unlock()
		go d.discardWarm(s)
		return nil
	}
	release, err := d.admitSession()
	if err != nil {
		return discard()
	}
	defer release()
	lease, err := d.store.Acquire(s.owner())
	if err != nil {
		return discard()
	}
	if lease.ManifestVersion != v {
		_ = d.store.Release(lease.ID)
		return discard()
	}
	s.setUpperLease(s.rec.Upper, lease.ID)
	s.rec.Warm, s.rec.Agent, s.rec.Created, s.rec.CreatedBy = false, a.Agent, time.Now().UTC(), a.RequestID
	if err := s.save(); err != nil {
		_ = d.store.Release(lease.ID)
		s.rec.LeaseID = ""
		return discard()
	}
	d.event(ctx, "lease.acquired", map[string]any{"lease_id": lease.ID, "workspace_session_id": s.rec.ID, "manifest_version": lease.ManifestVersion})
	s.act.touch()
	d.mu.Lock()
	d.sessions[s.rec.ID] = s
	d.warm.adopted++
	d.mu.Unlock()
	select {
	case d.warm.kick <- struct{}{}:
	default:
	}
	return s
}

// discardWarm removes a warm session that will not be adopted.
func (d *Daemon) discardWarm(s *session) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.teardown(ctx, s, false); err != nil {
		d.log.Warn("removing a stale warm session failed", "workspace_session_id", s.rec.ID, "err", err)
	}
}

// removeWarmAtBoot removes the warm session a daemon left behind: its
// session init may still run (a daemon restart) or not (a container one).
func (d *Daemon) removeWarmAtBoot(ctx context.Context, s *session) {
	if rs, err := d.rt.Load(s.rec.ID, d.runtimeSpec(s)); err == nil {
		s.setRuntime(rs)
	}
	if _, err := d.teardown(ctx, s, false); err != nil {
		d.log.Warn("removing a warm session at boot failed", "workspace_session_id", s.rec.ID, "err", err)
	}
}
