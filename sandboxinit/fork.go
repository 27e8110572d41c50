package sandboxinit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/observe"
)

// forkSession is create_workspace_session with from: a new session whose
// workspace starts as session from's is now — its published base (the same
// leased layers, shared, not copied) plus its unpublished changes (captured
// with its processes frozen and copied into the fork's own upper dir). From
// then on the two are independent: neither sees the other's writes, each
// publishes on its own. The fork's change set is relative to from's base,
// so it carries from's changes: if from publishes them first, the fork's
// identical copies merge as no-ops.
//
// Arguments not given are inherited from from (network profile, agent,
// limits, egress). Any failure undoes every step; a crash part-way leaves a
// session dir without a record (archived at the next start) and at most a
// lease no session owns (released then, sweepSessionLeases).
func (d *Daemon) forkSession(ctx context.Context, a api.CreateSessionArgs) (_ *session, retErr error) {
	asked, err := limitsOf(a.Limits)
	if err != nil {
		return nil, err
	}
	src, err := d.lockLive(a.From)
	if err != nil {
		return nil, err
	}
	defer src.gate.Unlock()
	switch {
	case src.rec.Implicit:
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"from": a.From}, "workspace session %s is an implicit session (a sessionless command's); it cannot be forked", a.From)
	case src.state != StateActive:
		return nil, api.Errorf(api.KindOperationConflict, map[string]any{"from": a.From, "state": src.state},
			"workspace session %s is %s; fork it once it is active again", a.From, src.state)
	}
	if a.NetworkProfile == "" {
		a.NetworkProfile = src.rec.NetworkProfile
	}
	switch a.NetworkProfile {
	case "shared", "isolated":
	default:
		return nil, api.Errorf(api.KindInvalidRequest, nil, "network_profile must be shared or isolated, not %q", a.NetworkProfile)
	}
	if a.Egress == nil && a.NetworkProfile == src.rec.NetworkProfile {
		a.Egress = src.rec.Egress
	}
	if _, err := egressOf(a.Egress); err != nil {
		return nil, err
	}
	if a.Egress != nil && a.Egress.Mode != api.EgressDefault && a.NetworkProfile != "isolated" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "egress"},
			"egress applies to isolated sessions: pass network_profile isolated (a shared session uses the sandbox's network)")
	}
	if a.Egress != nil && a.Egress.Mode == api.EgressDefault {
		a.Egress = nil
	}
	if a.Agent == "" {
		a.Agent = src.rec.Agent
	}
	if len(a.Agent) > 256 {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "agent label is longer than 256 bytes")
	}
	limits := src.rec.Limits
	if asked != nil {
		limits = *asked
	}
	ctx, sp := d.span(ctx, "workspace_session.fork", map[string]any{"from": a.From, "network_profile": a.NetworkProfile, "agent": a.Agent})
	defer func() { sp.End(retErr) }()
	release, err := d.admitSession()
	if err != nil {
		return nil, err
	}
	defer release()

	s := &session{state: StateActive, rec: sessionRecord{ID: newSessionID(), NetworkProfile: a.NetworkProfile,
		Agent: a.Agent, Upper: "upper-0", Egress: a.Egress, Limits: limits, Created: time.Now().UTC(), ForkedFrom: a.From, CreatedBy: a.RequestID, Anchored: true}}
	s.dir = filepath.Join(d.cfg.StateDir, "sessions", s.rec.ID)
	sp.Set("workspace_session_id", s.rec.ID)
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			d.teardown(context.WithoutCancel(ctx), s, true)
		}
	}()
	cs, thaw, err := d.capture(ctx, src)
	if err != nil {
		return nil, err
	}
	fr, err := d.store.Fork(ctx, src.rec.LeaseID, cs, s.upper(), s.owner())
	thaw()
	if err != nil {
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"from": a.From, "stage": "fork"}, "fork of %s failed: %s", a.From, d.confine(src, err))
	}
	s.setUpperLease(s.rec.Upper, fr.Lease.ID)
	d.event(ctx, "lease.acquired", map[string]any{"lease_id": fr.Lease.ID, "workspace_session_id": s.rec.ID, "manifest_version": fr.Lease.ManifestVersion})
	for _, sub := range []string{"work", "merged"} {
		if err := os.MkdirAll(filepath.Join(s.dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	if err := s.save(); err != nil {
		return nil, err
	}
	if err := d.start(ctx, s, fr.Lease); err != nil {
		return nil, err
	}
	s.act.touch()
	d.mu.Lock()
	d.sessions[s.rec.ID] = s
	d.mu.Unlock()
	sp.Set("changes", fr.Changes)
	sp.Set("bytes", fr.Bytes)
	d.event(ctx, "workspace_session.forked", map[string]any{"workspace_session_id": s.rec.ID, "from": a.From,
		"changes": fr.Changes, "bytes": fr.Bytes, "manifest_version": fr.Lease.ManifestVersion})
	return s, nil
}

// warmLeaseOwner prefixes the owner of a warm session's lease while it
// starts (createSessionAs) or moves (reheadWarm); the views leave such
// leases out of their counts.
const warmLeaseOwner = observe.WarmLeaseOwner

// sweepSessionLeases releases, after the sessions are restored, the leases
// of workspace sessions that do not exist: a create or fork that crashed
// between leasing and recording its session, or a warm build the daemon
// stopped in. Their layers would otherwise
// stay pinned for good. Archived sessions' leases are kept.
func (d *Daemon) sweepSessionLeases(ctx context.Context) {
	d.mu.Lock()
	live := make(map[string]bool, len(d.sessions))
	for id := range d.sessions {
		live[sessionOwner(id)] = true
	}
	d.mu.Unlock()
	// An archived session keeps its lease so that a restore finds its base.
	for _, a := range d.listArchived() {
		if a.Restorable {
			live[sessionOwner(a.ID)] = true
		}
	}
	for _, l := range d.store.Leases() {
		// A warm build's lease outlives its build only when the daemon
		// stopped during it: at boot it is always stray.
		stray := strings.HasPrefix(l.Owner, warmLeaseOwner) || strings.HasPrefix(l.Owner, "workspace_session:") && !live[l.Owner]
		if !stray {
			continue
		}
		if err := d.store.Release(l.ID); err != nil {
			d.log.Warn("release a lease no session owns", "lease_id", l.ID, "owner", l.Owner, "err", err)
			continue
		}
		d.event(ctx, "lease.released", map[string]any{"lease_id": l.ID, "owner": l.Owner, "reason": "no such session"})
	}
}
