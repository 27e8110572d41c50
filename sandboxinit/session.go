package sandboxinit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
	"golang.org/x/sys/unix"
)

// Session states.
const (
	StateActive         = "active"
	StateFinalizing     = "finalizing"
	StateFinalizeFailed = "finalize_failed"
)

// session is one workspace session: a lease on the layer stack, an upper
// dir on the state volume, the overlay mounted at merged, and the runtime
// session (a libcontainer container) whose /workspace is that overlay.
type session struct {
	rec sessionRecord
	dir string
	rt  *runtime.Session

	// gate serialises what changes the session as a whole (publish,
	// refresh, destroy) against admitting commands.
	gate sync.Mutex
	// mountMu is held shared by the daemon's file operations while they
	// use the mounted workspace (view), and exclusively while the
	// workspace is replaced (switchUpper). File operations never take the
	// gate, so a holder of the gate may wait for them.
	mountMu sync.RWMutex
	state   string
	act     activity

	// warmVersion: the manifest version a warm session is mounted on.
	warmVersion int64

	// seenMu guards rt, state, rec.LeaseID and rec.Upper for readers that
	// do not take the gate (the observability views and the sampler):
	// writers hold the gate and take seenMu for the write itself.
	seenMu sync.RWMutex
}

func (s *session) setState(st string) {
	s.seenMu.Lock()
	s.state = st
	s.seenMu.Unlock()
}

func (s *session) setRuntime(rs *runtime.Session) {
	s.seenMu.Lock()
	s.rt = rs
	s.seenMu.Unlock()
}

func (s *session) setUpperLease(upper, leaseID string) {
	s.seenMu.Lock()
	s.rec.Upper, s.rec.LeaseID = upper, leaseID
	s.seenMu.Unlock()
}

// seenState is what a view may read of a session without its gate.
type seenState struct {
	rt             *runtime.Session
	state, leaseID string
	upper          string // the upper dir's path
}

func (s *session) seen() seenState {
	s.seenMu.RLock()
	defer s.seenMu.RUnlock()
	return seenState{rt: s.rt, state: s.state, leaseID: s.rec.LeaseID, upper: s.upper()}
}

// sessionRecord is what persists in <state>/sessions/<id>/session.json, so
// a restarted daemon brings the session back with its unpublished work.
type sessionRecord struct {
	ID             string         `json:"workspace_session_id"`
	NetworkProfile string         `json:"network_profile"`
	Agent          string         `json:"agent,omitempty"`
	Implicit       bool           `json:"implicit,omitempty"`
	LeaseID        string         `json:"lease_id"`
	Upper          string         `json:"upper"` // dir name under the session dir
	Limits         runtime.Limits `json:"limits"`
	Addr           string         `json:"addr,omitempty"`
	Egress         *api.Egress    `json:"egress,omitempty"` // isolated only; nil = default
	Created        time.Time      `json:"created"`
	Generation     int            `json:"generation"`
	ForkedFrom     string         `json:"forked_from,omitempty"`
	// RestoredBy is the request id of the restore_workspace_session call
	// that brought the session back from the archive (a retry answers the
	// same).
	RestoredBy string `json:"restored_by,omitempty"`
	// VerifyTxID marks a verified publish's throwaway session: never
	// restored (a daemon that restarts removes it).
	VerifyTxID string `json:"verify_txid,omitempty"`
	// CreatedBy is the request id of the create_workspace_session call
	// that made the session (createOnce: a retry answers this session).
	CreatedBy string `json:"created_by,omitempty"`
	// Warm marks the warm session before it is adopted (warm.go): never
	// restored (a daemon that restarts removes it).
	Warm bool `json:"warm,omitempty"`
	// Destroyed marks a session whose destroy answered while the rest of
	// its teardown went on (retire): never restored (a daemon that
	// restarts finishes the teardown).
	Destroyed bool `json:"destroyed,omitempty"`
	// Anchored: the session runs on its workspace's anchor (start), so
	// another overlay can take its workspace's place without a restart
	// (switchUpper, rehead). Sessions started before anchors lack it.
	Anchored bool `json:"anchored,omitempty"`
}

func (s *session) owner() string { return sessionOwner(s.rec.ID) }

// sessionOwner is how the layer store names session id as a lease's and a
// publish's owner.
func sessionOwner(id string) string { return "workspace_session:" + id }
func (s *session) upper() string    { return filepath.Join(s.dir, s.rec.Upper) }
func (s *session) work() string     { return filepath.Join(s.dir, "work") }

// merged is where the daemon mounts the session's /workspace.
func (s *session) merged() string { return filepath.Join(s.dir, "merged") }

func newSessionID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "ws-" + hex.EncodeToString(b[:])
}

func (s *session) save() error {
	b, err := json.MarshalIndent(s.rec, "", " ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.dir, "session.json"), b)
}

func (d *Daemon) info(s *session) api.SessionInfo {
	policy := "no_op"
	if s.rec.Implicit {
		policy = "publish_then_destroy"
	}
	seen := s.seen() // listed without the gate
	inf := api.SessionInfo{WorkspaceSessionID: s.rec.ID, NetworkProfile: s.rec.NetworkProfile, FinalizePolicy: policy,
		Agent: s.rec.Agent, State: seen.state, Implicit: s.rec.Implicit, Created: s.rec.Created.Format(time.RFC3339Nano),
		ActiveCommands: d.cmds.Active(s.rec.ID), IdleSeconds: int64(s.act.since().Seconds())}
	if l, err := d.store.Lease(seen.leaseID); err == nil {
		inf.ManifestVersion = l.ManifestVersion
	}
	if seen.rt != nil {
		inf.IP = seen.rt.IP()
	}
	inf.Egress, inf.ForkedFrom = s.egress(), s.rec.ForkedFrom
	if inf.ActiveCommands == nil {
		inf.ActiveCommands = []string{}
	}
	return inf
}

// createSession makes a session on the current head. Any failure undoes
// every step, so nothing (lease, mount, dirs, container) is left behind.
func (d *Daemon) createSession(ctx context.Context, a api.CreateSessionArgs, implicit bool) (*session, error) {
	return d.createSessionAs(ctx, a, implicit, false)
}

// createSessionAs is createSession; warm makes the warm session instead
// (warm.go): its record says so, it is not in the session table, and its
// lease is released once it runs.
func (d *Daemon) createSessionAs(ctx context.Context, a api.CreateSessionArgs, implicit, warm bool) (_ *session, retErr error) {
	switch a.NetworkProfile {
	case "":
		a.NetworkProfile = "shared"
	case "shared", "isolated":
	default:
		return nil, api.Errorf(api.KindInvalidRequest, nil, "network_profile must be shared or isolated, not %q", a.NetworkProfile)
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
	if len(a.Agent) > 256 {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "agent label is longer than 256 bytes")
	}
	limits, err := limitsOf(a.Limits)
	if err != nil {
		return nil, err
	}
	ctx, sp := d.span(ctx, "workspace_session.create", map[string]any{"network_profile": a.NetworkProfile, "implicit": implicit, "agent": a.Agent, "warm": warm})
	defer func() { sp.End(retErr) }()
	if !warm && d.warmEligible(a, implicit) {
		if s := d.adoptWarm(ctx, a); s != nil {
			sp.Set("workspace_session_id", s.rec.ID)
			sp.Set("adopted_warm", true)
			d.event(ctx, "workspace_session.created", map[string]any{"workspace_session_id": s.rec.ID, "network_profile": a.NetworkProfile, "agent": a.Agent, "adopted_warm": true})
			return s, nil
		}
	}
	release, err := d.admitSession()
	if err != nil {
		return nil, err
	}
	defer release()
	s := &session{state: StateActive, rec: sessionRecord{ID: newSessionID(), NetworkProfile: a.NetworkProfile,
		Agent: a.Agent, Implicit: implicit, Upper: "upper-0", Egress: a.Egress, Created: time.Now().UTC(), CreatedBy: a.RequestID, Warm: warm,
		Anchored: true}}
	if limits != nil {
		s.rec.Limits = *limits
	}
	s.dir = filepath.Join(d.cfg.StateDir, "sessions", s.rec.ID)
	sp.Set("workspace_session_id", s.rec.ID)
	// A warm session holds its lease only while it starts, as the warm
	// builder's (no view counts it as a workspace's), in memory only (a
	// daemon that stops meanwhile removes the warm session at boot): no
	// disk wait, and the commit lock only for a moment.
	var lease *layerstack.Lease
	if warm {
		lease, err = d.store.Hold(warmLeaseOwner + s.rec.ID)
	} else {
		lease, err = d.store.Acquire(s.owner())
	}
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	s.setUpperLease(s.rec.Upper, lease.ID)
	if !warm {
		d.event(ctx, "lease.acquired", map[string]any{"lease_id": lease.ID, "workspace_session_id": s.rec.ID, "manifest_version": lease.ManifestVersion})
	}
	defer func() {
		if retErr != nil {
			d.teardown(context.WithoutCancel(ctx), s, true)
		}
	}()
	for _, sub := range []string{s.rec.Upper, "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(s.dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	if err := s.save(); err != nil {
		return nil, err
	}
	if err := d.start(ctx, s, lease); err != nil {
		return nil, err
	}
	if warm {
		s.warmVersion = lease.ManifestVersion
		d.store.Hit(layerstack.FailWarmBuild)
		if err := d.store.Release(lease.ID); err != nil {
			return nil, err
		}
		s.rec.LeaseID = ""
		return s, nil
	}
	s.act.touch()
	d.mu.Lock()
	d.sessions[s.rec.ID] = s
	d.mu.Unlock()
	d.event(ctx, "workspace_session.created", map[string]any{"workspace_session_id": s.rec.ID, "network_profile": a.NetworkProfile, "agent": a.Agent})
	return s, nil
}

// start starts the runtime session on the workspace's anchor and then
// mounts the workspace on lease there (the overlay reaches the session's
// /workspace through the anchor: anchorWorkspace), so that another
// overlay can take its place later without restarting the session
// (rehead). Until start returns nothing of the session runs but its init,
// whose working directory is /.
func (d *Daemon) start(ctx context.Context, s *session, lease *layerstack.Lease) error {
	if err := anchorWorkspace(s.merged()); err != nil {
		return err
	}
	var rs *runtime.Session
	// Never from a niced background thread: the session's init, and every
	// command it starts, would inherit its nice value (lane.go). A warm
	// session's too: its build is niced (buildWarm), its init is not (a
	// session is a CPU group of its own, where its processes' nice value
	// ranks them only against each other).
	err := unniced(func() (err error) { rs, err = d.rt.Start(ctx, d.runtimeSpec(s)); return })
	if err != nil {
		_ = unmountAll(s.merged())
		return fmt.Errorf("start session: %w", err)
	}
	if err := mountWorkspace(d.store.LowerDirs(lease), s.upper(), s.work(), s.merged()); err != nil {
		_ = rs.Destroy(context.WithoutCancel(ctx))
		_ = unmountAll(s.merged())
		return err
	}
	s.setRuntime(rs)
	if s.rec.Addr != rs.IP() || !s.rec.Anchored {
		s.rec.Addr, s.rec.Anchored = rs.IP(), true
		return s.save()
	}
	return nil
}

func (d *Daemon) runtimeSpec(s *session) runtime.SessionSpec {
	eg, _ := egressOf(s.rec.Egress) // checked when the session was created
	initPath, initArgs := d.cfg.SelfPath, []string{"sessinit"}
	if d.cfg.SessinitPath != "" { // the small init: an idle session is this process
		initPath, initArgs = d.cfg.SessinitPath, nil
	}
	return runtime.SessionSpec{
		ID: s.rec.ID, Dir: filepath.Join(s.dir, "rt"), Workspace: s.merged(),
		Isolated: s.rec.NetworkProfile == "isolated", Addr: s.rec.Addr, Limits: s.rec.Limits, Egress: eg,
		Hidden: d.cfg.hidden(), InitPath: initPath, InitArgs: initArgs,
	}
}

// egress is the session's egress policy as the views show it: nil for a
// shared session, "default" for an isolated one without a policy.
func (s *session) egress() *api.Egress {
	if s.rec.NetworkProfile != "isolated" {
		return nil
	}
	if s.rec.Egress == nil {
		return &api.Egress{Mode: api.EgressDefault}
	}
	return s.rec.Egress
}

// egressOf validates a wire egress policy and converts it for the runtime.
func egressOf(e *api.Egress) (runtime.Egress, error) {
	if e == nil {
		return runtime.Egress{}, nil
	}
	rules, err := e.Rules()
	if err != nil {
		return runtime.Egress{}, err
	}
	out := runtime.Egress{None: e.Mode == api.EgressNone}
	for _, r := range rules {
		out.Allow = append(out.Allow, runtime.EgressRule{Prefix: r.Prefix, Port: r.Port})
	}
	if e.Mode == api.EgressAllow && len(out.Allow) == 0 {
		out.None = true // an empty allow-list allows nothing
	}
	return out, nil
}

// limitsOf is a session's limits as asked on the wire (nil: none asked),
// refused as invalid_request naming the field before anything is made for
// the session.
func limitsOf(l *api.SessionLimits) (*runtime.Limits, error) {
	if l == nil {
		return nil, nil
	}
	out := runtime.Limits{PidsMax: l.PidsMax, MemoryBytes: l.MemoryBytes, CPUs: l.CPUs}
	var le *runtime.LimitError
	if err := out.Check(); errors.As(err, &le) {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "limits." + le.Field}, "limits.%s", le.Error())
	} else if err != nil {
		return nil, err
	}
	return &out, nil
}

// stop ends the runtime session and unmounts the workspace (the upper dir
// and lease stay).
func (d *Daemon) stop(ctx context.Context, s *session) error {
	var errs []error
	if s.rt != nil {
		var err error
		if !s.rec.Warm { // as session-teardown
			err = d.store.Injected(layerstack.FailRuntimeDestroy)
		}
		if err == nil {
			err = s.rt.Destroy(ctx)
		}
		if err != nil {
			errs = append(errs, err)
		}
		s.setRuntime(nil) // recover and the reaper read this as "to be started again"
	}
	if err := unmountAll(s.merged()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// teardown removes a session completely: runtime, mount, dirs, lease. It
// takes the session out of the table whatever happens (closeSession keeps
// one whose teardown failed).
func (d *Daemon) teardown(ctx context.Context, s *session, releaseLease bool) (int64, error) {
	lease := leaseKept
	if releaseLease {
		lease = leaseReleased
	}
	return d.dismantle(ctx, s, lease, false)
}

// leaseOnClose says what a teardown does with the session's lease.
type leaseOnClose int

const (
	leaseKept             leaseOnClose = iota // left to the caller
	leaseReleased                             // released even if the teardown fails
	leaseReleasedWhenGone                     // released once the teardown succeeded
)

// closeSession is the teardown of a close: the close a committed publish
// asked for (its lease released whatever happens: the commit took its
// changes, and the boot reads a session over a released lease whose
// commit stands as one to close, not to start again), or a failed
// destroy's (leaseReleasedWhenGone: its processes may live on over the
// lease's layers). One that fails leaves s listed finalize_failed until
// recover_workspace_session, a retried destroy or the next boot finishes
// the close: from the commit's record, or the record that says
// destroyed; their close reaps a runtime the failed one lost track of.
// The session is never out of the table meanwhile: a destroy retried in
// that moment would answer not_found, which the sandbox's workflow takes
// for destroyed. A session whose dir is gone leaves the table (nothing is
// left to finish).
func (d *Daemon) closeSession(ctx context.Context, s *session, lease leaseOnClose) (int64, error) {
	return d.dismantle(ctx, s, lease, true)
}

func (d *Daemon) dismantle(ctx context.Context, s *session, lease leaseOnClose, keepFailed bool) (int64, error) {
	sctx, sp := d.span(ctx, "session.stop", nil)
	var err error
	if !s.rec.Warm { // a warm session's rebuild does not take a test's failpoint
		err = d.store.Injected(layerstack.FailSessionTeardown)
	}
	if err == nil {
		// Both run: a reap that failed still leaves the workspace to
		// unmount, and its error keeps the close from counting as done.
		err = errors.Join(d.reap(sctx, s), d.stop(sctx, s))
	}
	sp.End(err)
	bytes := dirBytes(s.upper())
	if err == nil {
		_, sp := d.span(ctx, "session.remove_dir", nil)
		err = d.removeDir(s.dir)
		sp.End(err)
	}
	keep := false
	if err != nil && keepFailed {
		s.setState(StateFinalizeFailed)
		_, serr := os.Stat(s.dir)
		keep = serr == nil
	}
	if s.rec.LeaseID != "" && (lease == leaseReleased || lease == leaseReleasedWhenGone && err == nil) {
		if rerr := d.store.Release(s.rec.LeaseID); rerr != nil && err == nil {
			err = rerr
		} else if rerr == nil {
			d.event(ctx, "lease.released", map[string]any{"lease_id": s.rec.LeaseID, "workspace_session_id": s.rec.ID})
		}
	}
	d.mu.Lock()
	if keep {
		if d.sessions[s.rec.ID] == nil {
			d.sessions[s.rec.ID] = s
		}
	} else {
		delete(d.sessions, s.rec.ID)
	}
	d.mu.Unlock()
	return bytes, err
}

// reap removes, before s is torn down, a runtime of it the daemon lost
// track of: one whose destroy failed (stop drops the handle, which recover
// and the reaper read as "to be started again"), or one a failed start
// left behind. It is found by the session's id, whatever part of it is
// left, so the close ends its processes and frees its cgroup and network
// rather than leaving them until the daemon's next boot.
func (d *Daemon) reap(ctx context.Context, s *session) error {
	if s.rt != nil || d.rt == nil {
		return nil
	}
	return d.rt.Reap(ctx, s.rec.ID, d.runtimeSpec(s))
}

// retire is a destroy's teardown. The destroy waits for what makes the
// session gone: every process of it killed, its record marked destroyed,
// its lease released, and the session out of the daemon's table. The rest
// (its workspace and its anchor unmounted, the container's cgroup, its
// root overlay and network, the session dir: 5-20 ms, most of a destroy's
// time) goes on in the background (d.bg, which Close waits for); a daemon
// that stops first finishes it at boot, from the record (restoreSessions).
// The lease goes before the unmount: nothing reads the workspace any more
// (its processes are dead, the daemon's file operations find no session),
// so layers that only it held may go while it is still mounted.
//
// The kill and the record's write go side by side (each about a
// millisecond, the kill mostly waiting for the init to be gone, the write
// for the disk): whichever a crash interrupts, the session is gone after
// the restart or destroyed again by the destroy's retry. A record that
// says destroyed makes the boot remove the session, killing what is left
// of it (restoreSessions); a session killed whose record does not say so
// is started again at boot, and the retried destroy removes it.
//
// A runtime the daemon lost track of (s.rt nil: a failed stop, a failed
// start) is reaped in place of the kill. With force, a reap that fails
// (the runtime's state cannot be read) is logged and the destroy goes on:
// the boot reaps again.
func (d *Daemon) retire(ctx context.Context, s *session, force bool) (int64, error) {
	killed := make(chan error, 1)
	go func() {
		sctx, sp := d.span(ctx, "session.kill", nil)
		var err error
		if s.rt != nil {
			if err = d.store.Injected(layerstack.FailRuntimeKill); err == nil {
				err = s.rt.Kill(sctx)
			}
		} else if err = d.reap(sctx, s); err != nil && force {
			d.log.Warn("destroy with force: what is left of the session's runtime could not be reaped; the next daemon start tries again",
				"workspace_session_id", s.rec.ID, "err", err)
			err = nil
		}
		sp.End(err)
		killed <- err
	}()
	s.rec.Destroyed = true
	_, sp := d.span(ctx, "session.record", nil)
	err := s.save()
	sp.End(err)
	if err == nil {
		d.store.Hit(layerstack.FailDestroyRecorded)
	}
	killErr := <-killed
	if err != nil || killErr != nil {
		// The teardown stops the runtime if the kill could not. If that
		// fails too, the session stays listed, still meant to be
		// destroyed (s.rec.Destroyed, even if the record could not say
		// so), for a retried destroy or recover, which end it (reap),
		// rather than dropped with its processes running until the next
		// boot.
		return d.closeSession(ctx, s, leaseReleasedWhenGone)
	}
	bytes := dirBytes(s.upper())
	if s.rec.LeaseID != "" {
		_, sp := d.span(ctx, "lease.release", nil)
		err := d.store.Release(s.rec.LeaseID)
		sp.End(err)
		if err != nil {
			return 0, err
		}
		d.event(ctx, "lease.released", map[string]any{"lease_id": s.rec.LeaseID, "workspace_session_id": s.rec.ID})
	}
	d.mu.Lock()
	delete(d.sessions, s.rec.ID)
	d.mu.Unlock()
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		d.store.Hit(layerstack.FailDestroyTail)
		// After the answer, at the weight warm sessions are built at: the
		// session's processes are killed already, what is left is
		// unmounting and removing.
		runNiced(d.cfg.WarmNice, nil, func() {
			if _, err := d.teardown(ctx, s, false); err != nil {
				d.log.Error("finishing a destroyed session's teardown failed; the next daemon start finishes it", "workspace_session_id", s.rec.ID, "err", err)
			}
		})
	}()
	return bytes, nil
}

// session returns a live session or a not_found error.
func (d *Daemon) session(id string) (*session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[id]
	if s == nil {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"workspace_session_id": id}, "workspace session not found: %s", id)
	}
	return s, nil
}

func (d *Daemon) listSessions() []api.SessionInfo {
	d.mu.Lock()
	ss := make([]*session, 0, len(d.sessions))
	for _, s := range d.sessions {
		ss = append(ss, s)
	}
	d.mu.Unlock()
	sort.Slice(ss, func(i, j int) bool { return ss[i].rec.Created.Before(ss[j].rec.Created) })
	out := make([]api.SessionInfo, 0, len(ss))
	for _, s := range ss {
		out = append(out, d.info(s))
	}
	return out
}

func (d *Daemon) destroySession(ctx context.Context, a api.DestroySessionArgs) (_ *api.SessionDestroyed, retErr error) {
	// Once begun, a destroy finishes whatever its caller does (a local
	// call that outgrew its bound goes on as an activity: its call finds
	// the session gone, which the workflow answers as destroyed).
	ctx = context.WithoutCancel(ctx)
	ctx, sp := d.span(ctx, "workspace_session.destroy", map[string]any{"workspace_session_id": a.WorkspaceSessionID, "force": a.Force})
	defer func() { sp.End(retErr) }()
	s, err := d.lockLive(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer s.gate.Unlock()
	if s.state == StatePublishing && !a.Force {
		// Its publish holds the session's lease until it commits.
		return nil, api.Errorf(api.KindOperationConflict, map[string]any{"workspace_session_id": s.rec.ID, "finalization_state": s.state,
			"recovery_operation": "recover_workspace_session"},
			"workspace session %s is being published; wait for that publish to end, recover_workspace_session, or pass force", s.rec.ID)
	}
	if active := d.cmds.Active(s.rec.ID); len(active) > 0 && !a.Force {
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "active_command_session_ids": active},
			"workspace session %s has %d active command sessions; cancel them or pass force", s.rec.ID, len(active))
	}
	bytes, err := d.retire(ctx, s, a.Force)
	if err != nil {
		s.setState(StateFinalizeFailed)
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "stage": "destroy",
			"destroyed": false, "session_state": StateFinalizeFailed, "recovery_operation": "recover_workspace_session"},
			"destroy %s failed: %s (the session stays listed finalize_failed: destroy it again or recover_workspace_session)", s.rec.ID, d.confine(s, err))
	}
	sp.Set("evicted_upperdir_bytes", bytes)
	d.event(ctx, "workspace_session.destroyed", map[string]any{"workspace_session_id": s.rec.ID})
	return &api.SessionDestroyed{WorkspaceSessionID: s.rec.ID, Destroyed: true, EvictedUpperdirBytes: bytes}, nil
}

// restoreSessions re-attaches the sessions recorded on the state volume:
// after a daemon restart their containers still run (Load); after a
// container restart they are started again over the same upper dir.
func (d *Daemon) restoreSessions(ctx context.Context) error {
	root := filepath.Join(d.cfg.StateDir, "sessions")
	ents, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		s := &session{dir: filepath.Join(root, e.Name()), state: StateActive}
		if err := readJSON(filepath.Join(s.dir, "session.json"), &s.rec); err != nil || s.rec.ID != e.Name() {
			d.log.Warn("session dir without a valid record; archived", "dir", s.dir, "err", err)
			_ = os.Rename(s.dir, filepath.Join(d.cfg.StateDir, "archive", e.Name()+"-"+time.Now().UTC().Format("20060102T150405")))
			continue
		}
		s.act.touch()
		if s.rec.VerifyTxID != "" {
			d.removeThrowaway(ctx, s)
			continue
		}
		if s.rec.Warm || s.rec.Destroyed {
			d.removeAtBoot(ctx, s)
			continue
		}
		if d.pendingPublish(s.rec.ID) {
			s.setState(StatePublishing)
		}
		if err := d.restore(ctx, s); errors.Is(err, errClosedByCommit) {
			s.setState(StateFinalizeFailed) // closed below (finishOwnCommits)
		} else if err != nil {
			d.log.Error("restore session failed; its upper dir is kept", "workspace_session_id", s.rec.ID, "err", err)
			s.setState(StateFinalizeFailed)
		}
		d.mu.Lock()
		d.sessions[s.rec.ID] = s
		d.mu.Unlock()
	}
	return nil
}

func (d *Daemon) restore(ctx context.Context, s *session) error {
	relinked := false // on a new lease: a runtime still attached runs on the old one
	stale := ""       // an upper dir replaced by a fresh one, removed once unmounted
	lease, err := d.store.Lease(s.rec.LeaseID)
	if err != nil {
		// A crash between re-leasing (keep, refresh) and saving the record:
		// the session's newest lease is the one to use.
		if lease = d.newestLease(s.owner()); lease != nil && lease.Replaces != "" && lease.Replaces == s.rec.LeaseID {
			// Its publish with keep committed the upper dir's changes into
			// this lease's layers, or its refresh merged them onto these
			// layers in the staged upper dir: the session goes on over a
			// fresh upper dir or the staged one, as the publish's finalize
			// or the refresh would have put it. Its old upper dir over this
			// lease would hide what others changed in the files it had
			// changed, and its next publish would take that back.
			stale = s.upper()
			if err := d.finishMove(s, lease); err != nil {
				return err
			}
			relinked = true
		} else if lease == nil && d.closedByCommit(s) {
			// Its publish committed and released its lease, and closing it
			// failed: finishOwnCommits closes it, from the commit's record,
			// and its close reaps the runtime if that still runs (a daemon
			// restart).
			return errClosedByCommit
		} else if lease == nil {
			// A power cut after an adopted warm session's record reached
			// the disk and before its lease did (they are flushed side by
			// side, AcquireWith): nothing was written in it (nothing was
			// answered), so it starts on the head under a new lease.
			if lease, err = d.leaseEmptySession(s, err); err != nil {
				return err
			}
			relinked = true
		}
		s.setUpperLease(s.rec.Upper, lease.ID)
		if err := s.save(); err != nil {
			return err
		}
	}
	// After a daemon restart the session still runs: re-attach. After a
	// container restart it is gone: Load clears its leftovers (container
	// state, cgroup, root mount) and the session starts again below.
	rs, err := d.rt.Load(s.rec.ID, d.runtimeSpec(s))
	if err == nil && workspaceMounted(s.merged()) && !relinked {
		s.setRuntime(rs)
		return nil
	}
	if err == nil {
		_ = rs.Destroy(ctx)
	} else if !errors.Is(err, runtime.ErrGone) {
		return fmt.Errorf("re-attach: %w", err)
	}
	if err := unmountAll(s.merged()); err != nil {
		return err
	}
	if stale != "" {
		_ = os.RemoveAll(stale)
	}
	_ = os.RemoveAll(s.work())
	if err := os.MkdirAll(s.work(), 0o755); err != nil {
		return err
	}
	return d.start(ctx, s, lease)
}

// finishMove points session s, found on the lease that lease replaced,
// at the upper dir its move onto lease left: for a publish with keep a
// fresh, empty one; for a refresh the merged one it staged (without it the
// session is not restored: its old upper dir stays for recovery). The
// caller saves the record with lease and removes the old upper dir.
func (d *Daemon) finishMove(s *session, lease *layerstack.Lease) error {
	name := fmt.Sprintf("upper-%d", s.rec.Generation+1)
	next := filepath.Join(s.dir, name) // the move may have made it (switchUpper) before its record
	if lease.KeptBy != "" {
		if err := os.MkdirAll(next, 0o755); err != nil {
			return err
		}
	} else if _, err := os.Stat(next); err != nil {
		if err := os.Rename(filepath.Join(s.dir, "refresh-upper"), next); err != nil {
			return fmt.Errorf("lease %s was replaced by refresh lease %s, whose merged upper dir is missing: %w", s.rec.LeaseID, lease.ID, err)
		}
	}
	d.store.Hit(layerstack.FailFinishMove)
	s.rec.Generation++
	s.setUpperLease(name, s.rec.LeaseID)
	d.log.Warn("a session whose move onto a new lease a restart cut short goes on as the move would have left it",
		"workspace_session_id", s.rec.ID, "lease_id", lease.ID, "publish_txid", lease.KeptBy, "upper", name)
	return nil
}

// leaseEmptySession takes a new lease on the head for a session whose
// lease is gone (why: the lookup's error) if its upper dir is empty: it
// holds no work a new base could change. Otherwise the session cannot be
// restored.
func (d *Daemon) leaseEmptySession(s *session, why error) (*layerstack.Lease, error) {
	ents, err := os.ReadDir(s.upper())
	if err != nil || len(ents) > 0 {
		return nil, fmt.Errorf("lease %s: %w", s.rec.LeaseID, why)
	}
	lease, err := d.store.Acquire(s.owner())
	if err != nil {
		return nil, err
	}
	d.log.Warn("a session's lease was lost; its upper dir is empty, so it starts on the head", "workspace_session_id", s.rec.ID, "lost_lease_id", s.rec.LeaseID, "lease_id", lease.ID, "manifest_version", lease.ManifestVersion)
	return lease, nil
}

// errClosedByCommit is restore's answer for a session whose own publish
// committed and whose close did not finish: it is not started again.
var errClosedByCommit = errors.New("its publish committed; the session is closed, not restarted")

// closedByCommit reports whether session s is one a commit of its own
// (its own txid, made from its lease) was to close: a publish without
// keep, or an implicit session's.
func (d *Daemon) closedByCommit(s *session) bool {
	rec, err := d.store.TxRecord(s.ownTxID())
	return err == nil && !rec.Keep && rec.Owner == s.owner() && rec.FromLease == s.rec.LeaseID
}

func (d *Daemon) newestLease(owner string) *layerstack.Lease {
	var best *layerstack.Lease
	for _, l := range d.store.Leases() {
		if l.Owner == owner && (best == nil || l.Created.After(best.Created)) {
			best = l
		}
	}
	return best
}

// dirBytes sums the sizes below dir (an upper dir), by descriptors: a
// symlink is counted as itself, never followed.
func dirBytes(dir string) int64 {
	f, err := os.Open(dir)
	if err != nil {
		return 0
	}
	defer f.Close()
	var n int64
	_ = walkAt(f, "", func(_ string, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			n += st.Size
		}
		return nil
	})
	return n
}

// writeFileAtomic replaces one of the daemon's records on the state volume
// (owner-only, like everything there).
func writeFileAtomic(name string, data []byte) error {
	return atomicfile.WriteFile(name, data, 0o600)
}

func readJSON(name string, v any) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// pendingPublish reports whether a prepared publish of the session is not
// finalized yet (its commands stay refused until it is).
func (d *Daemon) pendingPublish(id string) bool {
	ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "txns"))
	for _, e := range ents {
		var p preparedPublish
		if readJSON(filepath.Join(d.cfg.StateDir, "txns", e.Name(), "prepared.json"), &p) == nil && p.SessionID == id &&
			p.Finalized == nil && !p.Aborted {
			return true
		}
	}
	return false
}

// removeDir deletes a session dir. A session's processes are already dead,
// but the kernel may still be finishing their last writes (an init's log, a
// lazily detached mount going away): retry briefly on "not empty" or "busy",
// then move what is left aside (trashDir) and finish removing it later, so
// closing a session never fails on a directory the kernel still holds.
func (d *Daemon) removeDir(dir string) error {
	var err error
	for i := 0; i < 5; i++ {
		if err = os.RemoveAll(dir); err == nil || !(errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EBUSY)) {
			return err
		}
		time.Sleep(time.Duration(20*(i+1)) * time.Millisecond)
	}
	left, _ := os.ReadDir(dir)
	names := make([]string, 0, len(left))
	for _, e := range left {
		names = append(names, e.Name())
	}
	trash := filepath.Join(d.cfg.StateDir, "archive", ".trash-"+filepath.Base(dir)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if rerr := os.Rename(dir, trash); rerr != nil {
		return fmt.Errorf("%w (left: %v; moving aside: %v)", err, names, rerr)
	}
	d.log.Warn("session dir not removable yet; moved aside", "dir", dir, "left", names, "err", err)
	go func() {
		for i := 0; i < 60; i++ {
			if os.RemoveAll(trash) == nil {
				return
			}
			time.Sleep(time.Second)
		}
	}()
	return nil
}

// sweepTrash removes session dirs moved aside by earlier runs.
func (d *Daemon) sweepTrash() {
	root := filepath.Join(d.cfg.StateDir, "archive")
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".trash-") {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}
