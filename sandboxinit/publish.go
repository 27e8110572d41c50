package sandboxinit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// busy refuses an operation on a session with running commands.
func (d *Daemon) busy(s *session, op string) error {
	if active := d.cmds.Active(s.rec.ID); len(active) > 0 {
		return api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "active_command_session_ids": active},
			"%s: workspace session %s has %d running command(s); wait for them or cancel them", op, s.rec.ID, len(active))
	}
	return nil
}

// lockIdle returns a session with its gate held, refusing (and releasing
// the gate) while commands run or while a prepared publish of it is still
// committing (a second publish or a refresh would capture or move what
// that publish froze); the caller runs unlock when done.
func (d *Daemon) lockIdle(id, op string) (*session, func(), error) {
	s, err := d.lockLive(id)
	if err != nil {
		return nil, nil, err
	}
	if s.state == StatePublishing {
		s.gate.Unlock()
		return nil, nil, api.Errorf(api.KindOperationConflict, map[string]any{"workspace_session_id": id, "finalization_state": StatePublishing,
			"recovery_operation": "recover_workspace_session"},
			"%s: workspace session %s is being published; wait for that publish to end (recover_workspace_session ends one that never does)", op, id)
	}
	if err := d.busy(s, op); err != nil {
		s.gate.Unlock()
		return nil, nil, err
	}
	return s, s.gate.Unlock, nil
}

// lockLive returns a live session with its gate held, or not_found: a
// session destroyed while the caller waited for its gate (a publish racing
// a destroy that won) is gone, not a capture of a removed directory.
func (d *Daemon) lockLive(id string) (*session, error) {
	s, err := d.session(id)
	if err != nil {
		return nil, err
	}
	s.gate.Lock()
	if !d.live(s) {
		s.gate.Unlock()
		return nil, errSessionNotFound(id)
	}
	return s, nil
}

// live reports whether s is still the registered session of its id.
func (d *Daemon) live(s *session) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sessions[s.rec.ID] == s
}

func errSessionNotFound(id string) error {
	return api.Errorf(api.KindNotFound, map[string]any{"workspace_session_id": id}, "workspace session not found: %s", id)
}

// stepFailed is a publish, refresh or diff failure of session s: not_found
// when the session went away meanwhile, else the error with its paths
// confined to the workspace (a refusal keeps its kind and details).
func (d *Daemon) stepFailed(s *session, stage string, err error) error {
	if !d.live(s) {
		return errSessionNotFound(s.rec.ID)
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		c := *ae
		c.Message = d.confine(s, errors.New(ae.Message))
		return &c
	}
	if errors.Is(err, layerstack.ErrTxTaken) {
		return api.Errorf(api.KindInvalidRequest, map[string]any{"workspace_session_id": s.rec.ID, "stage": stage, "session_retained": true},
			"%s refused: %s", stage, d.confine(s, err))
	}
	if errors.Is(err, layerstack.ErrTooDeep) {
		return api.Errorf(api.KindResourceExhausted, map[string]any{"workspace_session_id": s.rec.ID, "stage": stage, "session_retained": true,
			"limit": "layer_stack_depth", "max": layerstack.DefaultMaxDepth}, "%s refused: %s", stage, d.confine(s, err))
	}
	return api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "stage": stage, "session_retained": true},
		"%s failed: %s", stage, d.confine(s, err))
}

// confine renders err for a client: a path in the session's upper dir
// becomes its workspace path, and any other path on the state volume
// (frozen copies, layers, the runtime) is not named.
func (d *Daemon) confine(s *session, err error) string {
	msg := err.Error()
	if s != nil {
		msg = strings.ReplaceAll(msg, s.upper()+"/", "")
		msg = strings.ReplaceAll(msg, s.upper(), ".")
		msg = strings.ReplaceAll(msg, s.merged()+"/", "")
	}
	return hideStatePaths(msg, d.cfg.StateDir)
}

// confineErr is err as a client may read it: the message of a refusal, or
// of an internal error, without state volume paths (kind and details
// kept). The publish, refresh, diff and check entry points return through
// it, after the specific paths were already made workspace-relative.
func (d *Daemon) confineErr(err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if !errors.As(err, &ae) {
		if errors.Is(err, layerstack.ErrTxTaken) {
			return api.Errorf(api.KindInvalidRequest, nil, "%s", d.confine(nil, err))
		}
		return api.Errorf(api.KindInternal, nil, "%s", d.confine(nil, err))
	}
	if msg := d.confine(nil, errors.New(ae.Message)); msg != ae.Message {
		c := *ae
		c.Message = msg
		if rej, ok := err.(*publishRejected); ok {
			return &publishRejected{wire: &c, conflict: rej.conflict}
		}
		return &c
	}
	return err
}

// hideStatePaths replaces every path under dir in msg with "(daemon
// state)": dir standing alone (not inside another word or path, such as a
// txid publish/eos-...), with whatever path follows it.
func hideStatePaths(msg, dir string) string {
	dir = filepath.Clean(dir)
	var b strings.Builder
	for {
		i := strings.Index(msg, dir)
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		end := i + len(dir)
		if (i > 0 && pathByte(msg[i-1])) || (end < len(msg) && msg[end] != '/' && pathByte(msg[end])) {
			b.WriteString(msg[:end])
			msg = msg[end:]
			continue
		}
		if end < len(msg) && msg[end] == '/' {
			for end < len(msg) && !strings.ContainsRune(" \t\n\r:'\"", rune(msg[end])) {
				end++
			}
		}
		b.WriteString(msg[:i])
		b.WriteString("(daemon state)")
		msg = msg[end:]
	}
}

func pathByte(c byte) bool {
	return c == '/' || c == '.' || c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func (d *Daemon) publishSession(ctx context.Context, a api.PublishArgs) (_ map[string]any, retErr error) {
	defer func() { retErr = d.confineErr(retErr) }()
	s, unlock, err := d.lockIdle(a.WorkspaceSessionID, "publish")
	if err != nil {
		return nil, err
	}
	defer unlock()
	return d.publishLocked(ctx, s, a)
}

// committedButFailed is the answer to a publish (txid) of s whose commit
// stands although the store failed after its commit point and could not
// finish it (a lease it could not take on a full volume): the session is
// finalize_failed, so nothing is written into the upper dir the commit
// took, and recover_workspace_session or a retry finishes it.
func (d *Daemon) committedButFailed(s *session, txid string, err error) error {
	s.setState(StateFinalizeFailed)
	return api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "txid": txid, "committed": true,
		"session_state": StateFinalizeFailed, "recovery_operation": "recover_workspace_session"},
		"publish %s committed, but finishing it failed: %s", txid, d.confine(s, err))
}

// plainTxID is the txid of a publish of s without one (publish_workspace_session
// without exactly_once): a retry of a publish whose answer was lost replays
// its commit. A session moved onto a new upper dir (keep, refresh) has a
// new one.
func (s *session) plainTxID() string { return fmt.Sprintf("publish:%s:%d", s.rec.ID, s.rec.Generation) }

// ownTxID is the txid the daemon gives s's own publish: an implicit
// session's (its one command's), or plainTxID.
func (s *session) ownTxID() string {
	if s.rec.Implicit {
		return "implicit:" + s.rec.ID
	}
	return s.plainTxID()
}

// publishLocked runs with the session gate held: capture, commit, finalize.
func (d *Daemon) publishLocked(ctx context.Context, s *session, a api.PublishArgs) (_ map[string]any, retErr error) {
	if a.TxID == "" {
		// A session over a commit of its own that is not finished takes
		// no writes (finalize_failed: committedButFailed, a failed finalize;
		// the boot and recover finish it first): a retry replays that
		// commit and finishes it.
		a.TxID = s.plainTxID()
	}
	if rec, err := d.store.TxRecord(a.TxID); err == nil && rec.Owner == s.owner() && rec.FromLease != "" && rec.FromLease != s.rec.LeaseID {
		// This session's own commit under this txid, made from a lease it
		// has left since (a retried publish with keep, after the session
		// moved on): answered as it is, never finished again (which would
		// move or close the session over the work it wrote since).
		if rec.Keep && a.Keep {
			return map[string]any{"workspace_session_id": s.rec.ID, "publish": publishJSON(rec), "destroyed": false, "kept": true}, nil
		}
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"workspace_session_id": s.rec.ID, "txid": a.TxID, "session_retained": true},
			"txid %s names an earlier publish of workspace session %s (made from a lease it has left, keep %v); publish under a new txid", a.TxID, s.rec.ID, rec.Keep)
	}
	ctx, sp := d.span(ctx, "workspace_session.publish", map[string]any{"workspace_session_id": s.rec.ID, "txid": a.TxID, "implicit": s.rec.Implicit, "keep": a.Keep})
	defer func() { sp.End(retErr) }()
	fail := func(stage string, extra map[string]any, format string, args ...any) *api.Error {
		det := map[string]any{"workspace_session_id": s.rec.ID, "stage": stage, "session_retained": true}
		for k, v := range extra {
			det[k] = v
		}
		return api.Errorf(api.KindOperationFailed, det, format, args...)
	}
	ctx, unhold := holdWorkspace(ctx, s)
	defer unhold()
	_, csp := d.span(ctx, "workspace_session.capture_changes", map[string]any{"workspace_session_id": s.rec.ID})
	cs, release, err := d.capture(ctx, s)
	if cs != nil {
		csp.Set("changes", len(cs.Changes))
	}
	if err == nil {
		err = d.checkPublishSize(s, cs)
	}
	csp.End(err)
	if err != nil {
		return nil, err
	}
	defer release()
	out := publishOutcome{TxID: a.TxID, SessionID: s.rec.ID, Agent: s.rec.Agent, Owner: s.owner(), Message: a.Message,
		Source: sourceOf(s), Changes: cs}
	pctx, psp := d.span(ctx, "layerstack.publish", map[string]any{"txid": a.TxID, "changes": len(cs.Changes)})
	res, err := d.store.Publish(pctx, layerstack.PublishRequest{TxID: a.TxID, LeaseID: s.rec.LeaseID, Changes: cs,
		Owner: s.owner(), Agent: s.rec.Agent, Message: a.Message, Keep: a.Keep, AllowDrops: s.rec.Implicit,
		SourcesRead: release}) // thawed once the content is staged, not across the commit
	if res != nil {
		psp.Set("layer_id", res.LayerID)
		psp.Set("no_op", res.NoOp)
	}
	psp.End(err)
	release() // the publish froze its own copies: thaw before the session is closed or restarted
	if err != nil {
		out.Err = err
		d.recordPublish(ctx, out)
		var ce *layerstack.ConflictError
		if errors.As(err, &ce) {
			d.event(ctx, "workspace_session.publish.rejected", map[string]any{"workspace_session_id": s.rec.ID, "txid": a.TxID, "reason": ce.Reason(), "conflicts": len(ce.Conflicts)})
			return nil, &publishRejected{wire: fail("publish", rejectionDetails(ce), "publish rejected: %s", ce.Error()), conflict: ce}
		}
		if errors.Is(err, layerstack.ErrTxTaken) {
			// Another session's commit under this txid: not this one's,
			// which is refused with nothing changed.
			return nil, d.stepFailed(s, "publish", err)
		}
		if committed, _ := d.store.Committed(a.TxID); committed { // true with an error: found, its record not rewritten
			return nil, d.committedButFailed(s, a.TxID, err)
		}
		return nil, fail("publish", nil, "publish failed: %s", d.confine(s, err))
	}
	out.Result = res
	d.recordPublish(ctx, out)
	d.event(ctx, "workspace_session.published", map[string]any{"workspace_session_id": s.rec.ID, "txid": a.TxID, "layer_id": res.LayerID, "no_op": res.NoOp})
	resp := map[string]any{"workspace_session_id": s.rec.ID, "publish": publishJSON(res)}
	fctx, fsp := d.span(ctx, "workspace_session.finalize", map[string]any{"workspace_session_id": s.rec.ID, "keep": a.Keep})
	if a.Keep {
		if err := d.rebase(fctx, s, res.LeaseID); err != nil {
			fsp.End(err)
			s.setState(StateFinalizeFailed)
			return nil, finalizeFailed(s, res, d.confine(s, err))
		}
		s.setState(StateActive) // a retry that finished a commit left unfinished
		fsp.End(nil)
		resp["destroyed"], resp["kept"] = false, true
		return resp, nil
	}
	bytes, err := d.closeSession(fctx, s, leaseReleased)
	fsp.End(err)
	if err != nil {
		return nil, finalizeFailed(s, res, d.confine(s, err))
	}
	resp["destroyed"], resp["evicted_upperdir_bytes"] = true, bytes
	return resp, nil
}

// publishRejected is a publish the head refused: the wire error, and the
// report it was built from (an implicit session's command carries it).
type publishRejected struct {
	wire     *api.Error
	conflict *layerstack.ConflictError
}

func (e *publishRejected) Error() string { return e.wire.Error() }
func (e *publishRejected) Unwrap() error { return e.wire }

// finalizeFailed: the publish committed but closing (or moving) the
// session failed; recover_workspace_session finishes it.
func finalizeFailed(s *session, res *layerstack.PublishResult, why string) error {
	return api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "stage": "destroy",
		"publish_completed": true, "layer_committed": !res.NoOp, "publish": publishJSON(res), "destroyed": false,
		"session_state": StateFinalizeFailed, "recovery_operation": "recover_workspace_session"},
		"published, but closing the session failed: %s", why)
}

// rebase moves a session onto a new lease with an empty upper dir (after a
// publish with keep, whose changes are now in the head).
func (d *Daemon) rebase(ctx context.Context, s *session, leaseID string) error {
	return d.switchUpper(ctx, s, leaseID, "")
}

// switchUpper points the session at leaseID and a new upper dir
// (newUpper, or a fresh empty one) and saves the record. A session whose
// workspace nothing holds open (no process has its working directory, a
// file or a mapping in it: an idle session) keeps running: only its
// workspace's overlay is replaced (through its anchor, as rehead does,
// about a millisecond). Otherwise (the unmount is busy, or the session
// predates anchors) the session is stopped and started again on the new
// state, its processes ended. The record is saved before the old upper is
// removed, so a crash in between leaves a session that restores onto the
// new state (a crash with the workspace unmounted restarts the session at
// boot, as after a stop).
func (d *Daemon) switchUpper(ctx context.Context, s *session, leaseID, newUpper string) error {
	lease, err := d.store.Lease(leaseID)
	if err != nil {
		return err
	}
	if !holdsWorkspace(ctx, s) {
		s.mountMu.Lock() // no file operation uses the workspace while it moves
		defer s.mountMu.Unlock()
	}
	inPlace := s.rec.Anchored && s.rt != nil && workspaceMounted(s.merged()) && unmountWorkspace(s.merged()) == nil
	if inPlace {
		d.store.Hit(layerstack.FailMoveInPlace)
	} else if err := d.stop(ctx, s); err != nil {
		return err
	}
	old := s.upper()
	s.rec.Generation++
	name := fmt.Sprintf("upper-%d", s.rec.Generation)
	if newUpper == "" {
		if err := os.MkdirAll(filepath.Join(s.dir, name), 0o755); err != nil {
			return err
		}
	} else if err := os.Rename(newUpper, filepath.Join(s.dir, name)); err != nil {
		return err
	}
	s.setUpperLease(name, leaseID)
	if err := s.save(); err != nil {
		return err
	}
	_ = os.RemoveAll(old)
	_ = os.RemoveAll(s.work())
	if err := os.MkdirAll(s.work(), 0o755); err != nil {
		return err
	}
	if inPlace {
		err := mountWorkspace(d.store.LowerDirs(lease), s.upper(), s.work(), s.merged())
		if err == nil {
			return nil
		}
		d.log.Warn("mounting the moved workspace failed; restarting the session", "workspace_session_id", s.rec.ID, "err", err)
		if err := d.stop(ctx, s); err != nil {
			return err
		}
	}
	return d.start(ctx, s, lease)
}

// holdWorkspace takes s's workspace exclusively (mountMu) for an operation
// that captures the session's changes and then closes the session or
// replaces its upper dir (a publish, a refresh): a file operation that
// comes meanwhile waits, and then lands in the new upper dir (keep,
// refresh) or finds the session gone (a publish that closed it), instead
// of in changes already captured, or under a capture in progress. The
// returned context says so to switchUpper; release ends the hold.
func holdWorkspace(ctx context.Context, s *session) (context.Context, func()) {
	s.mountMu.Lock()
	return context.WithValue(ctx, heldWorkspace{}, s), s.mountMu.Unlock
}

type heldWorkspace struct{}

// holdsWorkspace reports whether ctx carries holdWorkspace's hold of s.
func holdsWorkspace(ctx context.Context, s *session) bool {
	held, _ := ctx.Value(heldWorkspace{}).(*session)
	return held == s
}

func (d *Daemon) refreshSession(ctx context.Context, a api.SessionArgs) (_ *api.RefreshResult, retErr error) {
	ctx, sp := d.span(ctx, "workspace_session.refresh", map[string]any{"workspace_session_id": a.WorkspaceSessionID})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	s, unlock, err := d.lockIdle(a.WorkspaceSessionID, "refresh")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if st := s.seen().state; st == StateFinalizeFailed {
		// Perhaps over an upper dir a commit took: moving it onto the head
		// would leave that publish unfinished (recover finishes it).
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "finalization_state": st,
			"recovery_operation": "recover_workspace_session"}, "refresh: workspace session %s is %s", s.rec.ID, st)
	}
	ctx, unhold := holdWorkspace(ctx, s)
	defer unhold()
	cs, release, err := d.capture(ctx, s)
	if err != nil {
		return nil, err
	}
	defer release()
	if d.refreshCopies(s) {
		// What a publish of it could not take, a refresh does not copy.
		if err := d.checkPublishSize(s, cs); err != nil {
			return nil, err
		}
	}
	staged := filepath.Join(s.dir, "refresh-upper")
	_ = os.RemoveAll(staged)
	res, err := d.store.Refresh(ctx, s.rec.LeaseID, cs, staged)
	release() // thaw before the session is restarted on the new upper dir
	if err != nil {
		var ce *layerstack.ConflictError
		if errors.As(err, &ce) {
			return nil, api.Errorf(api.KindOperationFailed, mergeMaps(map[string]any{"workspace_session_id": s.rec.ID, "stage": "refresh", "session_retained": true}, rejectionDetails(ce)),
				"refresh rejected: %s", ce.Error())
		}
		return nil, d.stepFailed(s, "refresh", err)
	}
	out := &api.RefreshResult{WorkspaceSessionID: s.rec.ID, UpToDate: res.UpToDate, Revision: revisionJSON(res.Revision),
		MergedPaths: nonNil(res.MergedPaths), ChangedPaths: res.Changes}
	sp.Set("up_to_date", res.UpToDate)
	if res.UpToDate {
		return out, nil
	}
	if err := d.switchUpper(ctx, s, res.LeaseID, staged); err != nil {
		s.setState(StateFinalizeFailed)
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "stage": "refresh",
			"session_state": StateFinalizeFailed, "recovery_operation": "recover_workspace_session"},
			"refresh %s: remount failed: %s", s.rec.ID, d.confine(s, err))
	}
	return out, nil
}

// captured returns a session and its current change set, with the release
// the caller defers (see capture).
func (d *Daemon) captured(ctx context.Context, id string) (*session, *layerstack.ChangeSet, func(), error) {
	s, err := d.session(id)
	if err != nil {
		return nil, nil, nil, err
	}
	cs, release, err := d.capture(ctx, s)
	if err != nil {
		return nil, nil, nil, err
	}
	return s, cs, release, nil
}

func (d *Daemon) diffSession(ctx context.Context, a api.SessionArgs) (_ map[string]any, retErr error) {
	defer func() { retErr = d.confineErr(retErr) }()
	s, cs, release, err := d.captured(ctx, a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer release()
	var buf bytes.Buffer
	sum, err := d.store.Diff(ctx, s.rec.LeaseID, cs, &buf)
	release()
	if err != nil {
		return nil, d.stepFailed(s, "diff", err)
	}
	return map[string]any{"workspace_session_id": s.rec.ID, "diff": buf.String(), "paths": sum.Paths}, nil
}

func (d *Daemon) checkPublish(ctx context.Context, a api.SessionArgs) (_ map[string]any, retErr error) {
	defer func() { retErr = d.confineErr(retErr) }()
	s, cs, release, err := d.captured(ctx, a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := d.store.CheckPublish(ctx, layerstack.PublishRequest{LeaseID: s.rec.LeaseID, Changes: cs, AllowDrops: s.rec.Implicit,
		SourcesRead: release})
	release()
	var ce *layerstack.ConflictError
	switch {
	case errors.As(err, &ce):
		return mergeMaps(map[string]any{"workspace_session_id": s.rec.ID, "clean": false}, rejectionDetails(ce)), nil
	case err != nil:
		return nil, d.stepFailed(s, "check", err)
	}
	return map[string]any{"workspace_session_id": s.rec.ID, "clean": true, "publish": publishJSON(res), "conflicts": []any{}}, nil
}

// publishJSON is the seed's publish shape plus our fields.
func publishJSON(r *layerstack.PublishResult) *api.PublishSummary {
	c := r.Counts
	return &api.PublishSummary{NoOp: r.NoOp, Revision: revisionJSON(r.Revision),
		RouteSummary: api.RouteSummary{SourceCount: r.RouteSummary.SourceCount, IgnoredCount: r.RouteSummary.IgnoredCount},
		LayerID:      r.LayerID, TxID: r.TxID, MergedPaths: nonNil(r.MergedPaths),
		Counts: api.ChangeCounts{Files: c.Files, Dirs: c.Dirs, Symlinks: c.Symlinks, Deletes: c.Deletes, Opaques: c.Opaques},
		Bytes:  r.Bytes}
}

func revisionJSON(r layerstack.Revision) api.Revision {
	return api.Revision{ManifestVersion: r.ManifestVersion, RootHash: r.RootHash, LayerCount: r.LayerCount}
}

// rejection renders a conflict report: every path, and the seed's single
// publish_rejection (the first path).
func rejection(ce *layerstack.ConflictError) *api.Rejection {
	r := &api.Rejection{Conflicts: make([]api.Conflict, 0, min(len(ce.Conflicts), 1024)), HeadRevision: revisionJSON(ce.Head)}
	// About what each takes as JSON, against api.MaxConflictReportBytes.
	const conflictBytes, hunkBytes = 600, 120
	left := api.MaxConflictReportBytes
	for i, c := range ce.Conflicts {
		left -= conflictBytes + len(c.Path) + len(c.Message)
		if left < 0 && i > 0 {
			r.ConflictsOmitted = len(ce.Conflicts) - i
			break
		}
		ac := api.Conflict{Path: c.Path, Reason: c.Reason, Kind: c.Kind, Message: c.Message,
			Base: fingerprintJSON(c.Base), Head: fingerprintJSON(c.Head), Ours: fingerprintJSON(c.Ours)}
		for _, h := range c.Hunks {
			if left -= hunkBytes; left < 0 {
				break
			}
			ac.Hunks = append(ac.Hunks, api.ConflictHunk{Base: api.LineRange(h.Base), Head: api.LineRange(h.Head), Ours: api.LineRange(h.Ours)})
		}
		ac.HunksOmitted = max(len(c.Hunks), c.HunksTotal) - len(ac.Hunks)
		r.Conflicts = append(r.Conflicts, ac)
	}
	if len(ce.Conflicts) > 0 {
		c := ce.Conflicts[0]
		rej := &api.PublishRejection{Path: c.Path, Reason: c.Reason, Message: c.Message}
		if c.Reason == layerstack.ReasonSourceConflict {
			rej.SourceConflict = &api.SourceConflict{Path: c.Path, Expected: fingerprintJSON(c.Base), Actual: fingerprintJSON(c.Head)}
		} else {
			rej.ProtectedDrop = &api.ProtectedDrop{Path: c.Path, Reason: c.Reason}
		}
		r.PublishRejection = rej
	}
	return r
}

// rejectionDetails is a conflict report as error details.
func rejectionDetails(ce *layerstack.ConflictError) map[string]any { return rejection(ce).Details(nil) }

// refreshCopies: a refresh of s would copy its change set (its lease is
// not on the head; one that is answers up to date and copies nothing).
func (d *Daemon) refreshCopies(s *session) bool {
	l, err := d.store.Lease(s.rec.LeaseID)
	if err != nil {
		return true
	}
	m, err := d.store.Manifest()
	return err != nil || m.Version != l.ManifestVersion
}

// fingerprintJSON turns "file:0755:<sha>" into the seed's
// {kind:"file", digest, executable} (and symlink, directory, absent).
func fingerprintJSON(fp string) *api.Fingerprint {
	switch {
	case fp == "":
		return nil
	case fp == "absent":
		return &api.Fingerprint{Kind: "absent"}
	case strings.HasPrefix(fp, "file:"):
		parts := strings.SplitN(fp, ":", 3)
		if len(parts) == 3 {
			mode, _ := strconv.ParseUint(parts[1], 8, 32)
			exec := mode&0o111 != 0
			return &api.Fingerprint{Kind: "file", Digest: parts[2], Mode: parts[1], Executable: &exec}
		}
	case strings.HasPrefix(fp, "symlink:"):
		return &api.Fingerprint{Kind: "symlink", Target: fp[len("symlink:"):]}
	case strings.HasPrefix(fp, "dir:"):
		return &api.Fingerprint{Kind: "directory", Mode: fp[len("dir:"):]}
	case strings.HasPrefix(fp, "tree:"):
		return &api.Fingerprint{Kind: "directory", TreeDigest: fp[len("tree:"):]}
	}
	return &api.Fingerprint{Kind: "unknown", Raw: fp}
}

func mergeMaps(a, b map[string]any) map[string]any {
	for k, v := range b {
		a[k] = v
	}
	return a
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
