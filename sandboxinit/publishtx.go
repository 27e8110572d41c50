package sandboxinit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// publishTx is publish_workspace_session with exactly_once: the sandbox
// workflow's publish, one call instead of prepare, commit and finalize.
//
// Exactly once by the transaction id: the store commits a txid once (a
// retry replays its result), and the commit is recorded under txns/
// before the answer, so a retry after the session was closed answers from
// the record. The record is written by the commit itself and made durable
// by its flush (layerstack.CommitRecord: no write and fsync of its own
// after the commit, about a millisecond of the answer); a daemon that dies
// before the commit point may leave it behind, and it is void then
// (Committing without a store commit): the boot reconcile or the retry
// removes it, the session is active with its changes, and the retry
// publishes it.
//
// A session that is not kept is closed after the answer (the commit is
// what the caller waits for; unmounting and destroying the session's
// container is not): it leaves the session table at once (later calls on
// it are not_found), and a goroutine tears it down holding the session's
// gate and the transaction's lock (a retry waits for it). A daemon that
// dies meanwhile finds the committed, unfinalized record at boot and
// finalizes it (reconcilePublishes); a teardown that fails puts the session
// back as finalize_failed for recover_workspace_session. A kept session is
// moved onto the new head before the answer: its agent's next command runs
// there.
func (d *Daemon) publishTx(ctx context.Context, a api.PublishArgs) (_ *api.PublishTxResult, retErr error) {
	if a.Verify == nil {
		// Once asked, an exactly-once publish runs to its end whatever its
		// caller does: the sandbox workflow calls it from a local activity
		// first, and a caller that went away (a timed-out local call, a
		// gateway killed with its Temporal) finds the result recorded under
		// the txid when it, or its fallback activity, asks again.
		ctx = context.WithoutCancel(ctx)
	}
	ctx, sp := d.span(ctx, "workspace_session.publish", map[string]any{"workspace_session_id": a.WorkspaceSessionID, "txid": a.TxID, "keep": a.Keep, "exactly_once": true})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	if a.TxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "txid"}, "txid is required with exactly_once")
	}
	if a.WorkspaceSessionID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "workspace_session_id"}, "workspace_session_id is required")
	}
	unlockTx := d.lockTx(a.TxID)
	handedOver := false
	defer func() {
		if !handedOver {
			unlockTx()
		}
	}()
	if p, err := d.loadPrepared(a.TxID); err == nil {
		replay, err := d.settleCommitting(ctx, p)
		if err != nil {
			return nil, err
		}
		if replay {
			sp.Set("replayed", true)
			return d.replayTx(ctx, p, a)
		}
	}
	committed, err := d.store.Committed(a.TxID)
	if err != nil {
		return nil, err
	}
	if committed {
		// Committed and not recorded: a daemon that died between the two,
		// or a record that could not be written (see below). A verified
		// publish too: its retry must not freeze and verify what the
		// session holds now and take the old commit for it.
		sp.Set("replayed", true)
		return d.replayCommit(ctx, a)
	}
	if a.Verify != nil {
		return d.publishVerified(ctx, a)
	}
	s, unlock, err := d.lockIdle(a.WorkspaceSessionID, "publish")
	if err != nil {
		return nil, err
	}
	defer func() {
		if !handedOver {
			unlock()
		}
	}()
	ctx, unhold := holdWorkspace(ctx, s)
	defer unhold()
	cs, release, err := d.capture(ctx, s)
	if err == nil {
		err = d.checkPublishSize(s, cs)
	}
	if err != nil {
		if release != nil {
			release()
		}
		return nil, err
	}
	defer release()
	sp.Set("changes", len(cs.Changes))
	out := publishOutcome{TxID: a.TxID, SessionID: s.rec.ID, Agent: s.rec.Agent, Owner: s.owner(), Message: a.Message,
		Source: sourceOf(s), Changes: cs}
	lease := s.rec.LeaseID
	p := &preparedPublish{TxID: a.TxID, SessionID: s.rec.ID, LeaseID: lease, Upper: s.rec.Upper, Owner: s.owner(), Agent: s.rec.Agent,
		Message: a.Message, Keep: a.Keep, Implicit: s.rec.Implicit, Committing: true}
	rec, err := d.commitRecord(p)
	if err != nil {
		return nil, err
	}
	pctx, psp := d.span(ctx, "layerstack.publish", map[string]any{"txid": a.TxID, "changes": len(cs.Changes)})
	res, err := d.store.Publish(pctx, layerstack.PublishRequest{TxID: a.TxID, LeaseID: lease, Changes: cs,
		Owner: s.owner(), Agent: s.rec.Agent, Message: a.Message, Keep: a.Keep, AllowDrops: s.rec.Implicit,
		SourcesRead: release, // thawed once the content is staged
		Record:      rec})
	if res != nil {
		psp.Set("layer_id", res.LayerID)
		psp.Set("no_op", res.NoOp)
		psp.Set("replayed", res.Replayed)
	}
	psp.End(err)
	release()
	if err != nil {
		out.Err = err
		d.recordPublish(ctx, out)
		var ce *layerstack.ConflictError
		if errors.As(err, &ce) {
			d.event(ctx, "workspace_session.publish.rejected", map[string]any{"workspace_session_id": s.rec.ID, "txid": a.TxID, "reason": ce.Reason(), "conflicts": len(ce.Conflicts)})
			return &api.PublishTxResult{PublishFinalResult: api.PublishFinalResult{TxID: a.TxID, WorkspaceSessionID: s.rec.ID},
				Clean: false, Rejection: rejection(ce)}, nil
		}
		if committed, _ := d.store.Committed(a.TxID); committed { // true with an error: found, its record not rewritten
			return nil, d.committedButFailed(s, a.TxID, err)
		}
		return nil, d.stepFailed(s, "publish", err)
	}
	out.Result = res
	d.recordPublish(ctx, out)
	d.event(ctx, "workspace_session.published", map[string]any{"workspace_session_id": s.rec.ID, "txid": a.TxID, "layer_id": res.LayerID, "no_op": res.NoOp})
	p.Result = res
	// The record before the answer: a retry after the session is gone
	// answers from it, and the boot reconcile finalizes it. The commit
	// wrote it (without the result, which the store keeps by the txid);
	// a kept session's finalize reads the result from it, so that one is
	// written again here, as is a record the commit could not write.
	err = nil
	if a.Keep || !rec.Written {
		err = d.store.Injected(layerstack.FailPublishRecord)
		if err == nil {
			err = os.MkdirAll(d.txDir(p.TxID), 0o700)
		}
		if err == nil {
			err = d.savePrepared(p)
		}
	}
	if err != nil {
		// Committed, not recorded (a full volume): the session is closed
		// now, before the answer, and a retry answers from the store's
		// record of the txid.
		d.log.Warn("publish committed but its record could not be written; closing the session before answering", "txid", p.TxID, "err", err)
		if rec.Written {
			// The commit's record (no result) must not outlive this: a
			// later boot or recover would finalize the session again,
			// from a lease it may have left since.
			if rerr := os.RemoveAll(d.txDir(p.TxID)); rerr != nil {
				return nil, d.committedButFailed(s, p.TxID, fmt.Errorf("its record can be neither completed (%v) nor removed: %w", err, rerr))
			}
		}
		fin, err := d.finalizeUnrecorded(ctx, s, a.TxID, res, a.Keep)
		if err != nil {
			return nil, err
		}
		return &api.PublishTxResult{PublishFinalResult: *fin, Clean: true}, nil
	}
	if a.Keep {
		// Held off commands until it is on the new head.
		s.setState(StatePublishing)
		unlock()
		handedOver = true // the gate; the txid's lock is still released below
		defer unlockTx()
		fin, err := d.finalizeLocked(ctx, p.TxID)
		if err != nil {
			return nil, err
		}
		return &api.PublishTxResult{PublishFinalResult: *fin, Clean: true}, nil
	}
	bytes := dirBytes(s.upper())
	fin := &api.PublishFinalResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID, Publish: publishJSON(res), Destroyed: true, EvictedUpperdirBytes: &bytes}
	s.setState(StateFinalizing)
	d.mu.Lock()
	if d.sessions[s.rec.ID] == s {
		delete(d.sessions, s.rec.ID)
	}
	d.mu.Unlock()
	handedOver = true
	d.bg.Add(1)
	go d.closeAfterPublish(context.WithoutCancel(ctx), s, p, fin, unlockTx)
	return &api.PublishTxResult{PublishFinalResult: *fin, Clean: true}, nil
}

// commitRecord is the record of exactly-once publish p for its commit to
// write (see preparedPublish.Committing). A stale record of the txid was
// settled before (settleCommitting).
func (d *Daemon) commitRecord(p *preparedPublish) (*layerstack.CommitRecord, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	return &layerstack.CommitRecord{Path: filepath.Join(d.txDir(p.TxID), "prepared.json"), Data: b}, nil
}

// settleCommitting decides what a retried exactly-once publish does with
// the record it found: a record without a result whose commit the store
// made gets its result and is replayed (finalized: a verified publish
// whose record could not take its result after the commit, a commit's own
// record); one written with a commit the store did not make is void
// (removed: the publish starts over); every other record is replayed.
func (d *Daemon) settleCommitting(ctx context.Context, p *preparedPublish) (replay bool, err error) {
	if p.Result != nil || p.Aborted || p.Finalized != nil {
		return true, nil
	}
	committed, err := d.store.Committed(p.TxID)
	if err != nil {
		return false, err
	}
	switch {
	case committed:
		return true, d.recordCommit(ctx, p)
	case p.Committing:
		return false, d.voidUncommitted(p)
	}
	return true, nil
}

// closeAfterPublish tears down session s, whose publish p committed and
// answered fin, with its gate and the txid's lock held (released here).
func (d *Daemon) closeAfterPublish(ctx context.Context, s *session, p *preparedPublish, fin *api.PublishFinalResult, unlockTx func()) {
	defer d.bg.Done()
	defer unlockTx()
	defer s.gate.Unlock()
	ctx, sp := d.span(ctx, "workspace_session.finalize", map[string]any{"workspace_session_id": s.rec.ID, "txid": p.TxID, "after_answer": true})
	_, err := d.closeSession(ctx, s, leaseReleased)
	if err == nil {
		_, err = d.finalized(p, fin)
	}
	sp.End(err)
	if err != nil {
		d.log.Error("closing a published session failed; recover_workspace_session finishes it", "workspace_session_id", s.rec.ID, "txid", p.TxID, "err", err)
	}
}

// replayTx answers a retried exactly-once publish from its record.
func (d *Daemon) replayTx(ctx context.Context, p *preparedPublish, a api.PublishArgs) (*api.PublishTxResult, error) {
	if p.SessionID != "" && p.SessionID != a.WorkspaceSessionID {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"txid": p.TxID, "workspace_session_id": a.WorkspaceSessionID},
			"txid %s belongs to a publish of workspace session %s", p.TxID, p.SessionID)
	}
	if p.Aborted && p.Answer != nil {
		return p.Answer, nil
	}
	if p.Aborted {
		return nil, errAborted(p)
	}
	if p.Finalized != nil {
		return &api.PublishTxResult{PublishFinalResult: *p.Finalized, Clean: true}, nil
	}
	if p.Result == nil {
		// Prepared by publish_prepare: publish_commit or publish_abort ends it.
		return nil, api.Errorf(api.KindOperationConflict, map[string]any{"txid": p.TxID, "workspace_session_id": p.SessionID},
			"publish %s was prepared step by step; commit or abort it", p.TxID)
	}
	// Committed, not finalized: a finalize that failed, or a daemon that
	// restarted before its boot reconcile reached it.
	fin, err := d.finalizeLocked(ctx, p.TxID)
	if err != nil {
		return nil, err
	}
	return &api.PublishTxResult{PublishFinalResult: *fin, Clean: true}, nil
}

// replayCommit answers a retried publish the store committed and the
// daemon did not record (its record could not be written, or was swept a
// day after the publish ended): the session, when it is still there and
// still where the publish found it, is closed (or with keep moved onto the
// new head) now. A retry is checked against the store's record of the txid
// first: the txid of another session's publish, or of one with the other
// keep, is refused with nothing changed; a kept session no longer on the
// lease the publish was made on (moved before the answer, then published
// or refreshed again) is answered as it is, its work untouched; a session
// that is not kept and no longer on it is not the publish's.
func (d *Daemon) replayCommit(ctx context.Context, a api.PublishArgs) (*api.PublishTxResult, error) {
	rec, err := d.store.TxRecord(a.TxID)
	if err != nil {
		return nil, err
	}
	if rec.Owner != "" && rec.Owner != sessionOwner(a.WorkspaceSessionID) {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"txid": a.TxID, "workspace_session_id": a.WorkspaceSessionID},
			"txid %s belongs to a publish of %s", a.TxID, rec.Owner)
	}
	if rec.FromLease != "" && rec.Keep != a.Keep { // a record that says
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"txid": a.TxID, "arg": "keep"},
			"txid %s was a publish with keep=%v", a.TxID, rec.Keep)
	}
	answer := func(res *layerstack.PublishResult) *api.PublishTxResult {
		return &api.PublishTxResult{Clean: true, PublishFinalResult: api.PublishFinalResult{TxID: a.TxID, WorkspaceSessionID: a.WorkspaceSessionID,
			Publish: publishJSON(res), Destroyed: !a.Keep, Kept: a.Keep}}
	}
	s, err := d.lockLive(a.WorkspaceSessionID)
	if err != nil {
		// Closed already: the store's record of the txid is the answer.
		return answer(rec), nil
	}
	defer s.gate.Unlock()
	if d.movedOn(s, rec, a.Keep) {
		if !a.Keep {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"txid": a.TxID, "workspace_session_id": a.WorkspaceSessionID},
				"txid %s is a publish workspace session %s has moved on from; it is not closed for it", a.TxID, s.rec.ID)
		}
		return answer(rec), nil
	}
	fin, err := d.finishCommitted(ctx, s, a.TxID, a.Keep)
	if err != nil {
		return nil, err
	}
	return &api.PublishTxResult{PublishFinalResult: *fin, Clean: true}, nil
}

// finishCommitted closes session s (gate held), still where its publish
// txid found it, after that publish committed without a daemon record; or
// with keep moves it onto the commit's lease.
func (d *Daemon) finishCommitted(ctx context.Context, s *session, txid string, keep bool) (*api.PublishFinalResult, error) {
	res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: txid, LeaseID: s.rec.LeaseID, Owner: s.owner(), Keep: keep})
	if err != nil {
		return nil, d.stepFailed(s, "publish", err)
	}
	return d.finalizeUnrecorded(ctx, s, txid, res, keep)
}

// movedOn reports whether session s is no longer where the committed
// publish rec found it: off the lease it was made on. A record from before
// records kept that lease says only its head: a kept session on a lease of
// that head or a later one has moved (its own lease before the commit was
// older); a live session is never closed on such a record.
func (d *Daemon) movedOn(s *session, rec *layerstack.PublishResult, keep bool) bool {
	if rec.FromLease != "" {
		return s.rec.LeaseID != rec.FromLease
	}
	if !keep {
		// Nothing tells whether that publish kept its session: closing
		// a live one on its word could take work written since.
		return true
	}
	if rec.NoOp {
		return false
	}
	l, err := d.store.Lease(s.rec.LeaseID)
	return err == nil && l.ManifestVersion >= rec.Revision.ManifestVersion
}

// txCommitted refuses to prepare a publish under txid when the store
// committed txid already and the daemon holds no record of it (a record
// swept a day after its publish ended, one that could not be written):
// prepared, such a publish could neither commit (the store replays the
// txid's commit, another owner's is refused) nor be aborted (its txid is
// committed), and the changes frozen under it would be taken for that
// commit.
func (d *Daemon) txCommitted(txid string, s *session) error {
	committed, err := d.store.Committed(txid)
	if err != nil || !committed {
		return err
	}
	return api.Errorf(api.KindInvalidRequest, map[string]any{"txid": txid, "workspace_session_id": s.rec.ID},
		"txid %s names a publish committed already; a new publish needs a new txid", txid)
}

// finalizeUnrecorded closes session s (gate held) after its publish res
// committed without a daemon record: destroyed, or with keep moved onto
// the new lease.
func (d *Daemon) finalizeUnrecorded(ctx context.Context, s *session, txid string, res *layerstack.PublishResult, keep bool) (*api.PublishFinalResult, error) {
	out := &api.PublishFinalResult{TxID: txid, WorkspaceSessionID: s.rec.ID, Publish: publishJSON(res)}
	if keep {
		if s.rec.LeaseID != res.LeaseID {
			if err := d.rebase(ctx, s, res.LeaseID); err != nil {
				s.setState(StateFinalizeFailed)
				return nil, finalizeFailed(s, res, d.confine(s, err))
			}
		}
		s.setState(StateActive)
		out.Kept = true
		return out, nil
	}
	bytes, err := d.closeSession(ctx, s, leaseReleased)
	if err != nil {
		return nil, finalizeFailed(s, res, d.confine(s, err))
	}
	out.Destroyed, out.EvictedUpperdirBytes = true, &bytes
	return out, nil
}

// waitFinalizes waits (until ctx ends) for the sessions being closed after
// their publish answered.
func (d *Daemon) waitFinalizes(ctx context.Context) {
	done := make(chan struct{})
	go func() { d.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
