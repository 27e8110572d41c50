package sandboxinit

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// unfinishedPublishes are the prepared publishes neither finalized nor
// aborted, of session id ("" for every session), oldest txid first.
func (d *Daemon) unfinishedPublishes(id string) []*preparedPublish {
	root := filepath.Join(d.cfg.StateDir, "txns")
	ents, _ := os.ReadDir(root)
	var out []*preparedPublish
	for _, e := range ents {
		var p preparedPublish
		if readJSON(filepath.Join(root, e.Name(), "prepared.json"), &p) != nil {
			continue
		}
		if p.Finalized == nil && !p.Aborted && (id == "" || p.SessionID == id) {
			out = append(out, &p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TxID < out[j].TxID })
	return out
}

// settlePublish ends one unfinished publish the way its record says it
// must: committed (by the record, or by the store when the record missed
// it) is finalized, anything else is aborted. It reports which.
func (d *Daemon) settlePublish(ctx context.Context, txid, by string) (finalized bool, err error) {
	unlock := d.lockTx(txid)
	defer unlock()
	_, err = d.abortLocked(ctx, txid, "", by)
	var e *api.Error
	if err == nil {
		return false, nil
	} else if !errors.As(err, &e) || e.Details["committed"] != true {
		return false, err
	}
	_, err = d.finalizeLocked(ctx, txid)
	return true, err
}

// reconcilePublishes runs at boot, after the sessions are restored: a
// publish this daemon prepared and did not finish would otherwise hold its
// session in "publishing" until a workflow that may be gone ends it. A
// commit on record is finalized (once: finalize is idempotent), anything
// else aborted; a workflow still running finds the same answer when it
// retries. Transaction dirs without a record are the freezes of prepares
// that never finished: no prepare runs at boot, so they go.
func (d *Daemon) reconcilePublishes(ctx context.Context) {
	for _, p := range d.unfinishedPublishes("") {
		finalized, err := d.settlePublish(ctx, p.TxID, AbortedByRestart)
		if err != nil {
			d.log.Error("settling an unfinished publish at boot failed", "txid", p.TxID, "workspace_session_id", p.SessionID, "err", err)
			continue
		}
		d.log.Info("settled an unfinished publish at boot", "txid", p.TxID, "workspace_session_id", p.SessionID, "finalized", finalized)
	}
	root := filepath.Join(d.cfg.StateDir, "txns")
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(root, e.Name(), "prepared.json")); os.IsNotExist(err) {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
	d.finishOwnCommits(ctx)
}

// finishOwnCommits finishes, at boot, each session's publish that
// committed from the lease the session is still on: a crash, or a failure
// after the commit point, kept it from closing the session or, with keep,
// moving it. The session is closed or moved onto the commit's lease now
// (finishOwnCommit); one that cannot be is finalize_failed (it takes no
// writes: the commit took its upper dir). Sessions with a publish on
// record were settled before.
func (d *Daemon) finishOwnCommits(ctx context.Context) {
	d.mu.Lock()
	live := make([]*session, 0, len(d.sessions))
	for _, s := range d.sessions {
		live = append(live, s)
	}
	d.mu.Unlock()
	if len(live) == 0 {
		return
	}
	commits, err := d.store.CommitsFrom()
	if err != nil {
		d.log.Error("reading the layer store's publish records at boot failed; sessions over an unfinished commit are not finished", "err", err)
		return
	}
	for _, s := range live {
		if s.seen().state == StatePublishing {
			continue
		}
		s.gate.Lock()
		rec, err := d.finishOwnCommit(ctx, s, commits)
		if err != nil {
			s.setState(StateFinalizeFailed)
		}
		s.gate.Unlock()
		switch {
		case err != nil:
			d.log.Error("finishing a publish that committed before a restart failed; the session is finalize_failed", "workspace_session_id", s.rec.ID, "err", err)
		case rec != nil:
			d.log.Warn("finished a publish that committed before a restart", "workspace_session_id", s.rec.ID, "txid", rec.TxID, "keep", rec.Keep, "layer_id", rec.LayerID)
		}
	}
}

// finishOwnCommit finishes a publish of session s (gate held) that the
// store committed from the lease s is still on, which did not close s or,
// with keep, move it: s is closed, or moved onto the commit's lease. Until
// then s holds a taken upper dir and takes no writes (finalize_failed, or
// a restart); finishing it later would drop any. The publish is found by
// s's own txid (ownTxID), else among commits (CommitsFrom; nil: read
// them). It returns the publish's record, nil when there is none.
func (d *Daemon) finishOwnCommit(ctx context.Context, s *session, commits map[string]*layerstack.PublishResult) (*layerstack.PublishResult, error) {
	rec, err := d.store.TxRecord(s.ownTxID())
	switch {
	case err == nil && rec.FromLease == s.rec.LeaseID:
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, err // committed, perhaps, but unreadable: not taken for none
	default:
		if commits == nil {
			if commits, err = d.store.CommitsFrom(); err != nil {
				return nil, err
			}
		}
		if rec = commits[s.rec.LeaseID]; rec == nil || rec.Owner != s.owner() {
			return nil, nil
		}
	}
	_, err = d.finishCommitted(ctx, s, rec.TxID, rec.Keep)
	return rec, err
}

// recoverSession brings a session in any state back to active, keeping
// its work: an unfinished publish of it is settled (aborted, or finalized
// when it committed, which ends the session unless the publish kept it),
// and a session whose runtime is gone (a failed restore or remount) is
// started again over its upper dir.
func (d *Daemon) recoverSession(ctx context.Context, a api.SessionArgs) (_ *api.RecoverResult, retErr error) {
	ctx, sp := d.span(ctx, "workspace_session.recover", map[string]any{"workspace_session_id": a.WorkspaceSessionID})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	if a.WorkspaceSessionID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "workspace_session_id"}, "workspace_session_id is required")
	}
	out := &api.RecoverResult{WorkspaceSessionID: a.WorkspaceSessionID, AbortedTxIDs: []string{}, FinalizedTxIDs: []string{}}
	if s, err := d.session(a.WorkspaceSessionID); err == nil {
		out.PreviousState = s.seen().state
	}
	pending := d.unfinishedPublishes(a.WorkspaceSessionID)
	if out.PreviousState == "" && len(pending) == 0 {
		return nil, errSessionNotFound(a.WorkspaceSessionID)
	}
	for _, p := range pending {
		finalized, err := d.settlePublish(ctx, p.TxID, AbortedByRecover)
		if err != nil {
			return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": a.WorkspaceSessionID, "txid": p.TxID},
				"recover %s: settling publish %s failed: %s", a.WorkspaceSessionID, p.TxID, d.confine(nil, err))
		}
		if finalized {
			out.FinalizedTxIDs = append(out.FinalizedTxIDs, p.TxID)
		} else {
			out.AbortedTxIDs = append(out.AbortedTxIDs, p.TxID)
		}
	}
	s, err := d.lockLive(a.WorkspaceSessionID)
	if err != nil {
		// Finalizing its committed publish ended it.
		out.Destroyed, out.State = true, "destroyed"
		return out, nil
	}
	defer s.gate.Unlock()
	// A publish of it that committed and was not finished (its session
	// over the upper dir the commit took) is finished, not undone.
	if rec, err := d.finishOwnCommit(ctx, s, nil); err != nil {
		s.setState(StateFinalizeFailed)
		det := map[string]any{"workspace_session_id": s.rec.ID, "session_state": StateFinalizeFailed}
		if rec != nil {
			det["txid"], det["committed"] = rec.TxID, true
		}
		return nil, api.Errorf(api.KindOperationFailed, det, "recover %s: finishing its committed publish failed: %s", s.rec.ID, d.confine(s, err))
	} else if rec != nil {
		out.FinalizedTxIDs = append(out.FinalizedTxIDs, rec.TxID)
		if !d.live(s) {
			out.Destroyed, out.State = true, "destroyed"
			return out, nil
		}
	}
	if s.rec.Destroyed {
		// Its destroy failed once its record said destroyed (a runtime
		// that could not be ended): recover finishes the destroy rather
		// than start the session again.
		ctx := context.WithoutCancel(ctx) // as a destroy: once begun, it finishes
		if _, err := d.retire(ctx, s, false); err != nil {
			s.setState(StateFinalizeFailed)
			return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "session_state": StateFinalizeFailed},
				"recover %s: finishing its destroy failed: %s", s.rec.ID, d.confine(s, err))
		}
		d.event(ctx, "workspace_session.destroyed", map[string]any{"workspace_session_id": s.rec.ID, "by": "recover"})
		out.Destroyed, out.State = true, "destroyed"
		return out, nil
	}
	// The runtime is restarted only by a daemon that has one (the
	// in-process tests run without).
	if s.rt == nil && d.rt != nil {
		if err := d.restore(ctx, s); err != nil {
			s.setState(StateFinalizeFailed)
			return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "session_state": StateFinalizeFailed},
				"recover %s: restarting the session failed: %s", s.rec.ID, d.confine(s, err))
		}
	}
	s.setState(StateActive)
	s.act.touch()
	out.State = StateActive
	d.event(ctx, "workspace_session.recovered", map[string]any{"workspace_session_id": s.rec.ID, "previous_state": out.PreviousState,
		"aborted": len(out.AbortedTxIDs), "finalized": len(out.FinalizedTxIDs)})
	return out, nil
}
