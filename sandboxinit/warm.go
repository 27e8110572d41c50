package sandboxinit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// Warm sessions: shared-network sessions (Config.WarmSessions per sandbox,
// 4 by default), started before anyone asks (namespaces, cgroup, seccomp,
// overlay mount, session init), that the next plain create_workspace_session
// adopts, which then only takes a lease and writes the session's record.
// With four, creates in quick succession mostly find one ready while those
// adopted before are replaced (side by side, in the background): a start
// takes some 20 ms alone and 35-60 ms beside another start and the
// creates' own work, while creates back to back come every 20-30 ms. Of
// 80 such creates, with a pool of two 37-41 waited for a build, with
// three 15-31, with four 5-16 (the daemon view's warm_session.waited). It is
// built on the base as soon as the base is imported (the sandbox's first
// sessions follow its creation), and again right after one was adopted.
//
// A session must start on the head of its create, and a warm session is
// mounted on the head it was built on. When the head moved since (a
// publish, a squash), the create that adopts it moves it to its own head
// first (rehead: the workspace's overlay unmounted and the new head's
// mounted in its place, which reaches the session's /workspace through
// the workspace's anchor; about a millisecond, against some 20 for a new
// session): so an agent that publishes and then creates its next session
// adopts a warm one too. Once the head has been still for warmStable, the
// builder moves the stale ones itself (what their old overlay holds, such
// as the layers a squash replaced, is let go).
//
// Until it is adopted it is not a session of the sandbox: it is in no
// list, holds no lease (the layers under its mount stay on disk while it
// is mounted; a create reheads it under its own lease before anything
// reads them) and counts for no budget; a daemon that restarts removes it
// (its record says warm).
const (
	// DefaultWarmSessions is the pool the daemon keeps unless told.
	DefaultWarmSessions = 4
	// MaxWarmSessions bounds the pool (each idles at about 0.5 MiB).
	MaxWarmSessions = 4

	warmPoll   = 250 * time.Millisecond
	warmStable = time.Second
	// warmFirst is how many start on the base at once (warmOnBase): the
	// sandbox's first create waits for the first of them to end, and four
	// side by side end later than two. The builder's next round (warmPoll)
	// starts the rest.
	warmFirst = 2
)

// warmPool is the daemon's warm sessions and their builder's state.
type warmPool struct {
	ready    []*session      // ready to adopt, oldest first, each on its warmVersion
	version  int64           // the head when the latest build or rehead started
	building int             // builds running
	done     chan struct{}   // closed (and replaced) whenever a build ends
	kick     chan struct{}   // a build is wanted now (one was adopted)
	ctx      context.Context // the builder's; its cancel stops the builds
	cancel   context.CancelFunc
	// Counters, for the trace and the tests. waited counts the creates
	// that found none ready and waited for a build (waitedFor in all): a
	// pool too small for how fast its sandbox's sessions come.
	built, adopted, discarded, reheaded, waited int
	waitedFor                                   time.Duration
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
	d.warm.done = make(chan struct{})
	d.warm.ctx, d.warm.cancel = ctx, cancel
	d.mu.Unlock()
	go d.runWarm(ctx)
}

// stopWarm stops the builder and removes the warm sessions that are ready.
func (d *Daemon) stopWarm(ctx context.Context) {
	d.mu.Lock()
	cancel := d.warm.cancel
	d.warm.ctx, d.warm.cancel = nil, nil
	d.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	d.mu.Lock()
	for d.warm.building > 0 && ctx.Err() == nil { // a build ending now discards its session
		done := d.warm.done
		d.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		d.mu.Lock()
	}
	ready := d.warm.ready
	d.warm.ready = nil
	d.mu.Unlock()
	for _, s := range ready {
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
			// The first head this builder sees (the base just imported,
			// or the head at boot) is built on at once: the sandbox's
			// first sessions follow its creation. A head a publish moved
			// to waits warmStable.
			if last > 0 {
				since = time.Now()
			} else {
				since = time.Time{}
			}
			last = v
		}
		d.mu.Lock()
		if kicked || time.Since(since) >= warmStable {
			d.reheadStaleLocked(ctx, v)
			d.refillWarmLocked(ctx, v, d.cfg.WarmSessions)
		}
		d.mu.Unlock()
	}
}

// reheadStaleLocked moves the ready warm sessions that are not on version
// v onto it, in the background: each counts as a build while it moves (a
// create waits for it rather than start its own). d.mu is held.
func (d *Daemon) reheadStaleLocked(ctx context.Context, v int64) {
	w := &d.warm
	if v <= 0 {
		return
	}
	fresh := w.ready[:0]
	var stale []*session
	for _, s := range w.ready {
		if s.warmVersion == v {
			fresh = append(fresh, s)
		} else {
			stale = append(stale, s)
		}
	}
	clear(w.ready[len(fresh):])
	w.ready = fresh
	for _, s := range stale {
		w.building++
		w.version = v
		go func() {
			err := d.reheadWarm(ctx, s)
			d.mu.Lock()
			d.buildEndedLocked(s, err)
			d.mu.Unlock()
		}()
	}
}

// refillWarmLocked starts the builds the pool misses, on version v (the
// head when it is called; a build that ends on an older one is reheaded
// like any stale warm session), a build per missing session at once (a
// build is mostly waiting: on the kernel, on runc's init), while there is
// room under MaxSessions, until the pool holds want. d.mu is held.
func (d *Daemon) refillWarmLocked(ctx context.Context, v int64, want int) {
	w := &d.warm
	if v <= 0 {
		return
	}
	for len(w.ready)+w.building < want && len(d.sessions)+d.creating+len(w.ready)+w.building+1 < d.cfg.MaxSessions {
		w.building++
		w.version = v
		go d.buildWarm(ctx)
	}
}

// warmOnBase starts the warm builds on the base the store was just
// initialised with, before the import answers: a create that follows the
// sandbox's creation finds them running and adopts the first that ends
// (adoptWarm waits for builds on the head) instead of starting its own.
func (d *Daemon) warmOnBase() {
	v := d.headVersion()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.warm.ctx == nil {
		return // no builder (the pool is off, or the daemon is closing)
	}
	d.refillWarmLocked(d.warm.ctx, v, min(d.cfg.WarmSessions, warmFirst))
}

// buildWarm starts a warm session on the head and adds it to the pool.
// The daemon's side of it (the session's directories, cgroup and mounts,
// libcontainer's side of runc's init) runs at nice --warm-nice: a build
// is work for a create yet to come, and must not slow the commands and
// file operations the daemon serves now. Its session's init is forked at
// the daemon's weight (start): it runs in the session's own CPU group.
func (d *Daemon) buildWarm(ctx context.Context) {
	var s *session
	var err error
	runNiced(d.cfg.WarmNice, nil, func() {
		s, err = d.createSessionAs(ctx, api.CreateSessionArgs{NetworkProfile: "shared"}, false, true)
	})
	d.mu.Lock()
	if err == nil {
		d.warm.built++
	}
	d.buildEndedLocked(s, err)
	d.mu.Unlock()
}

// buildEndedLocked ends a build or a rehead of s (failed with err, which
// then removed what it made): s joins the pool unless the builder was
// stopped meanwhile. d.mu is held.
func (d *Daemon) buildEndedLocked(s *session, err error) {
	w := &d.warm
	w.building--
	close(w.done)
	w.done = make(chan struct{})
	switch {
	case err != nil:
		d.log.Warn("building or moving a warm session failed", "err", err)
	case w.ctx == nil:
		w.discarded++
		go d.discardWarm(s)
	default:
		w.ready = append(w.ready, s)
	}
}

// reheadWarm moves the warm session s onto the head under a lease of the
// builder's own, in memory only (released when it is done: a warm session
// holds none). On failure s is removed.
func (d *Daemon) reheadWarm(ctx context.Context, s *session) (err error) {
	defer func() {
		if err != nil {
			d.mu.Lock()
			d.warm.discarded++
			d.mu.Unlock()
			d.discardWarm(s)
		}
	}()
	lease, err := d.store.Hold(warmLeaseOwner + s.rec.ID)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := d.store.Release(lease.ID); err == nil {
			err = rerr
		}
	}()
	d.mu.Lock()
	d.warm.reheaded++
	d.mu.Unlock()
	return d.rehead(ctx, s, lease)
}

// rehead moves the workspace of the warm session s onto lease's version:
// its overlay unmounted (from the session's /workspace too: the anchor),
// a new empty upper dir, and the overlay of lease's layers mounted in its
// place. A warm session runs nothing but its init, which never had the
// workspace open, so the unmount cannot be busy; the old upper dir, empty
// (nothing wrote to a warm session's workspace), is removed.
func (d *Daemon) rehead(ctx context.Context, s *session, lease *layerstack.Lease) (err error) {
	_, sp := d.span(ctx, "session.rehead", map[string]any{"workspace_session_id": s.rec.ID, "from_manifest_version": s.warmVersion, "to_manifest_version": lease.ManifestVersion})
	defer func() { sp.End(err) }()
	if err := unmountWorkspace(s.merged()); err != nil {
		return err
	}
	d.store.Hit(layerstack.FailWarmRehead)
	old := s.upper()
	name := fmt.Sprintf("upper-%d", s.rec.Generation+1)
	if err := os.Mkdir(filepath.Join(s.dir, name), 0o755); err != nil {
		return err
	}
	if err := mountWorkspace(d.store.LowerDirs(lease), filepath.Join(s.dir, name), s.work(), s.merged()); err != nil {
		_ = os.Remove(filepath.Join(s.dir, name))
		return err
	}
	s.rec.Generation++
	s.setUpperLease(name, s.rec.LeaseID)
	s.warmVersion = lease.ManifestVersion
	if err := os.Remove(old); err != nil {
		d.log.Warn("removing a reheaded warm session's old upper dir", "workspace_session_id", s.rec.ID, "err", err)
	}
	return nil
}

// adoptWarm hands a warm session to a create, moved onto the head of the
// create if the head moved since it was built (rehead), or returns nil (the
// create makes its session the usual way). With none ready, the builds in
// progress are waited for: they started earlier than a new create would.
func (d *Daemon) adoptWarm(ctx context.Context, a api.CreateSessionArgs) *session {
	head := d.headVersion()
	d.mu.Lock()
	var waitStart time.Time
	for len(d.warm.ready) == 0 && d.warm.building > 0 {
		if waitStart.IsZero() {
			waitStart = time.Now()
			d.warm.waited++
		}
		done := d.warm.done
		d.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			d.mu.Lock()
			d.warm.waitedFor += time.Since(waitStart)
			d.mu.Unlock()
			return nil
		}
		d.mu.Lock()
	}
	if !waitStart.IsZero() {
		d.warm.waitedFor += time.Since(waitStart)
	}
	s := d.warm.take(head)
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
	// The session's record as the create makes it, written and flushed
	// beside its lease when the session needs no move (the head did not
	// move since it was built): two disk waits instead of four.
	adopted := s.rec
	adopted.Warm, adopted.Agent, adopted.Created, adopted.CreatedBy = false, a.Agent, time.Now().UTC(), a.RequestID
	recorded := false
	_, sp := d.span(ctx, "lease.acquire", nil)
	lease, err := d.store.AcquireWith(s.owner(), func(l *layerstack.Lease) (*atomicfile.File, error) {
		if l.ManifestVersion != s.warmVersion {
			return nil, nil // moved onto the head first (rehead), then recorded
		}
		rec := adopted
		rec.LeaseID = l.ID
		b, err := json.MarshalIndent(rec, "", " ")
		if err != nil {
			return nil, err
		}
		recorded = true
		return &atomicfile.File{Name: filepath.Join(s.dir, "session.json"), Data: b, Perm: 0o600}, nil
	})
	sp.Set("with_record", recorded)
	sp.End(err)
	if err != nil {
		return discard()
	}
	if recorded {
		s.setUpperLease(s.rec.Upper, lease.ID)
		s.rec.Warm, s.rec.Agent, s.rec.Created, s.rec.CreatedBy = false, a.Agent, adopted.Created, a.RequestID
		return d.adopted(ctx, s, lease)
	}
	if lease.ManifestVersion != s.warmVersion {
		if err := d.rehead(ctx, s, lease); err != nil {
			_ = d.store.Release(lease.ID)
			return discard()
		}
		d.mu.Lock()
		d.warm.reheaded++
		d.mu.Unlock()
	}
	s.setUpperLease(s.rec.Upper, lease.ID)
	s.rec.Warm, s.rec.Agent, s.rec.Created, s.rec.CreatedBy = false, a.Agent, time.Now().UTC(), a.RequestID
	_, sp = d.span(ctx, "session.record", nil)
	err = s.save()
	sp.End(err)
	if err != nil {
		_ = d.store.Release(lease.ID)
		s.rec.LeaseID = ""
		return discard()
	}
	return d.adopted(ctx, s, lease)
}

// adopted puts warm session s, recorded as a create's on lease, in the
// session table and asks for a warm session in its place.
func (d *Daemon) adopted(ctx context.Context, s *session, lease *layerstack.Lease) *session {
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

// take removes and returns the oldest ready warm session on version v,
// else the oldest ready one (to be moved onto v), or nil.
func (w *warmPool) take(v int64) *session {
	if len(w.ready) == 0 {
		return nil
	}
	i := 0
	for j, s := range w.ready {
		if s.warmVersion == v {
			i = j
			break
		}
	}
	s := w.ready[i]
	w.ready = append(w.ready[:i], w.ready[i+1:]...)
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

// removeAtBoot removes a session a daemon left behind that is not to be
// restored, the warm session or a destroyed one (retire): its session init
// may still run (a daemon restart) or not (a container one). A destroyed
// session's lease is released already; releasing it again is a no-op.
func (d *Daemon) removeAtBoot(ctx context.Context, s *session) {
	if rs, err := d.rt.Load(s.rec.ID, d.runtimeSpec(s)); err == nil {
		s.setRuntime(rs)
	}
	if _, err := d.teardown(ctx, s, s.rec.Destroyed); err != nil {
		d.log.Warn("removing a session at boot failed", "workspace_session_id", s.rec.ID, "warm", s.rec.Warm, "destroyed", s.rec.Destroyed, "err", err)
	}
}

// initStore publishes base as the store's first version and starts the
// warm builds on it (warmOnBase).
func (d *Daemon) initStore(ctx context.Context, base layerstack.BaseInfo) (*layerstack.Manifest, error) {
	m, err := d.store.Init(ctx, base)
	if err == nil {
		d.warmOnBase()
	}
	return m, err
}
