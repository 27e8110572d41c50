package sandboxinit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// StatePublishing: a publish was prepared; commands wait until it is
// finalized or aborted.
const StatePublishing = "publishing"

// preparedPublish is what publish_prepare leaves on the state volume for
// publish_commit, so the steps survive a daemon or container restart.
type preparedPublish struct {
	TxID      string `json:"txid"`
	SessionID string `json:"workspace_session_id"`
	LeaseID   string `json:"lease_id"`
	// Upper is the session's upper dir the changes were captured from
	// (empty in records from before it was kept): a kept session still on
	// it is moved onto the new head by the finalize, one past it is not.
	Upper    string                    `json:"upper,omitempty"`
	Owner    string                    `json:"owner"`
	Agent    string                    `json:"agent,omitempty"`
	Message  string                    `json:"message,omitempty"`
	Keep     bool                      `json:"keep"`
	Implicit bool                      `json:"implicit"`
	Changes  layerstack.ChangeSet      `json:"changes"`
	Sources  map[string]string         `json:"sources"` // path -> frozen copy
	Result   *layerstack.PublishResult `json:"result,omitempty"`
	// Finalized is finalize's answer, kept so a retried finalize returns it.
	Finalized *api.PublishFinalResult `json:"finalized,omitempty"`
	Aborted   bool                    `json:"aborted,omitempty"`
	// AbortedBy says who aborted it: its workflow, recover_workspace_session,
	// or the boot reconcile of a daemon that restarted before the commit
	// (whose workflow may start the publish over).
	AbortedBy string `json:"aborted_by,omitempty"`
	// Answer is an exactly-once publish's answer when it ended without a
	// commit (a verification that failed): a retry gets it again.
	Answer *api.PublishTxResult `json:"answer,omitempty"`
	// Committing marks an exactly-once publish's record written with its
	// commit (layerstack.CommitRecord), before the commit point: without
	// a Result it stands only if the store committed the txid, and is
	// void otherwise (voidUncommitted).
	Committing bool `json:"committing,omitempty"`

	conflict *layerstack.ConflictError // the dry run's rejection, for the publish history
}

func (d *Daemon) txDir(txid string) string {
	sum := sha256.Sum256([]byte(txid))
	return filepath.Join(d.cfg.StateDir, "txns", hex.EncodeToString(sum[:12]))
}

func (d *Daemon) loadPrepared(txid string) (*preparedPublish, error) {
	var p preparedPublish
	if err := readJSON(filepath.Join(d.txDir(txid), "prepared.json"), &p); err != nil {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"txid": txid}, "no prepared publish %s", txid)
	}
	for i := range p.Changes.Changes {
		if src, ok := p.Sources[p.Changes.Changes[i].Path]; ok {
			p.Changes.Changes[i].Source = src
		}
	}
	return &p, nil
}

func (d *Daemon) savePrepared(p *preparedPublish) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(d.txDir(p.TxID), "prepared.json"), b)
}

// txLocks holds one mutex per publish transaction in progress.
type txLocks struct {
	mu sync.Mutex
	m  map[string]*txLock
}

type txLock struct {
	sync.Mutex
	refs int
}

// lockTx serialises the steps of transaction txid (a retried step that
// overlaps a slow first attempt, an abort racing a late prepare); steps of
// different transactions run side by side. The caller runs the returned
// unlock.
func (d *Daemon) lockTx(txid string) func() {
	t := &d.txs
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]*txLock{}
	}
	l := t.m[txid]
	if l == nil {
		l = &txLock{}
		t.m[txid] = l
	}
	l.refs++
	t.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		t.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(t.m, txid)
		}
		t.mu.Unlock()
	}
}

// publishPrepare captures the session's upper dir, freezes every file in a
// copy under txns/, and dry-runs the result against the head. Only a clean
// dry run leaves a prepared record and puts the session in "publishing": a
// prepare that fails or is rejected leaves the session active, so nothing
// but the record's abort or commit has to end it.
func (d *Daemon) publishPrepare(ctx context.Context, a api.PublishStepArgs) (_ *api.PublishStepResult, retErr error) {
	ctx, sp := d.span(ctx, "workspace_session.capture_changes", map[string]any{"workspace_session_id": a.WorkspaceSessionID, "txid": a.TxID, "step": "prepare"})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	if a.TxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "txid is required")
	}
	unlockTx := d.lockTx(a.TxID)
	defer unlockTx()
	if p, err := d.loadPrepared(a.TxID); err == nil {
		if p.Aborted {
			// An abort overtook this prepare (the workflow gave up waiting
			// for it): preparing now would leave a publish nobody ends.
			return nil, errAborted(p)
		}
		if a.WorkspaceSessionID != "" && p.SessionID != a.WorkspaceSessionID {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"txid": p.TxID, "workspace_session_id": a.WorkspaceSessionID},
				"txid %s belongs to a publish of workspace session %s", p.TxID, p.SessionID)
		}
		// A retried prepare answers as the first did: the same frozen
		// changes, checked against the head.
		out := &api.PublishStepResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID, Prepared: true, Replayed: true, ChangedPaths: len(p.Changes.Changes)}
		return d.checkPrepared(ctx, p, out)
	}
	s, unlock, err := d.lockIdle(a.WorkspaceSessionID, "publish")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.txCommitted(a.TxID, s); err != nil {
		return nil, err
	}
	cs, release, err := d.capture(ctx, s)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := d.checkPublishSize(s, cs); err != nil {
		return nil, err
	}
	dir := d.txDir(a.TxID)
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(dir)
		}
	}()
	p, err := d.freezeChanges(s, a.TxID, a.Message, a.Keep, cs, dir)
	if err != nil {
		return nil, err
	}
	release() // every write is frozen in txns/ now
	p.Changes = *cs
	sp.Set("changes", len(cs.Changes))
	out := &api.PublishStepResult{TxID: a.TxID, WorkspaceSessionID: s.rec.ID, Prepared: true, ChangedPaths: len(cs.Changes)}
	res, err := d.checkPrepared(ctx, p, out)
	if err != nil {
		return nil, d.stepFailed(s, "prepare", err)
	}
	if !res.Clean {
		// Nothing is prepared: the session stays active, and this dry run
		// is the only place the rejection shows.
		d.recordPublish(ctx, publishOutcome{TxID: p.TxID, SessionID: p.SessionID, Agent: p.Agent, Owner: p.Owner, Message: p.Message,
			Source: preparedSource(p), Changes: &p.Changes, Err: p.conflict})
		d.event(ctx, "workspace_session.publish.rejected", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID, "stage": "prepare"})
		res.Prepared = false
		return res, nil
	}
	// The record first, then the state: a crash in between leaves a
	// record the boot reconcile aborts, never a session publishing with
	// no record to end it.
	if err := d.savePrepared(p); err != nil {
		return nil, d.stepFailed(s, "prepare", err)
	}
	keep = true
	s.setState(StatePublishing)
	return res, nil
}

// freezeChanges copies the session's written files into the transaction's dir
// (dir/files/<n>) and points the change set at the copies, so the publish
// reads what the session wrote when it was frozen, whatever it does next.
func (d *Daemon) freezeChanges(s *session, txid, message string, keep bool, cs *layerstack.ChangeSet, dir string) (*preparedPublish, error) {
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o700); err != nil {
		return nil, d.stepFailed(s, "prepare", err)
	}
	p := &preparedPublish{TxID: txid, SessionID: s.rec.ID, LeaseID: s.rec.LeaseID, Upper: s.rec.Upper, Owner: s.owner(), Agent: s.rec.Agent,
		Message: message, Keep: keep, Implicit: s.rec.Implicit, Sources: map[string]string{}}
	for i, c := range cs.Changes {
		if c.Kind != layerstack.ChangeWrite {
			continue
		}
		dst := filepath.Join(dir, "files", strconv.Itoa(i))
		if err := copyRegular(c, dst); err != nil {
			return nil, d.stepFailed(s, "prepare", fmt.Errorf("freeze %s: %w", c.Path, err))
		}
		p.Sources[c.Path] = dst
		cs.Changes[i].Source = dst
	}
	return p, nil
}

// errAborted refuses a step of an aborted publish: by its workflow, by
// recover_workspace_session, or by the boot reconcile of a daemon that
// restarted before the publish committed.
func errAborted(p *preparedPublish) error {
	return api.Errorf(api.KindOperationFailed, map[string]any{"txid": p.TxID, "workspace_session_id": p.SessionID, "aborted": true,
		"aborted_by": p.AbortedBy, "session_retained": true, "stage": "publish"},
		"publish %s was aborted before it committed (its daemon restarted, or the session was recovered): nothing was committed and the session keeps its changes; publish it again", p.TxID)
}

func preparedSource(p *preparedPublish) string {
	if p.Implicit {
		return SourceImplicit
	}
	return SourceSession
}

// checkPrepared dry-runs frozen changes against the head.
func (d *Daemon) checkPrepared(ctx context.Context, p *preparedPublish, out *api.PublishStepResult) (*api.PublishStepResult, error) {
	if p.Result != nil {
		out.Clean, out.Publish, out.Committed = true, publishJSON(p.Result), true
		return out, nil
	}
	res, err := d.store.CheckPublish(ctx, layerstack.PublishRequest{LeaseID: p.LeaseID, Changes: &p.Changes, AllowDrops: p.Implicit})
	var ce *layerstack.ConflictError
	switch {
	case errors.As(err, &ce):
		p.conflict = ce
		out.Clean, out.Rejection = false, rejection(ce)
		return out, nil
	case err != nil:
		return nil, err
	}
	out.Clean, out.Publish = true, publishJSON(res)
	return out, nil
}

// publishCommit commits a prepared publish; a retry returns the first result.
func (d *Daemon) publishCommit(ctx context.Context, a api.PublishStepArgs) (_ *api.PublishStepResult, retErr error) {
	ctx, sp := d.span(ctx, "workspace_session.publish", map[string]any{"txid": a.TxID, "step": "commit"})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	unlockTx := d.lockTx(a.TxID)
	defer unlockTx()
	p, err := d.loadPrepared(a.TxID)
	if err != nil {
		return nil, err
	}
	if p.Aborted {
		return nil, errAborted(p)
	}
	sp.Set("workspace_session_id", p.SessionID)
	pctx, psp := d.span(ctx, "layerstack.publish", map[string]any{"txid": p.TxID, "changes": len(p.Changes.Changes)})
	res, err := d.store.Publish(pctx, layerstack.PublishRequest{TxID: p.TxID, LeaseID: p.LeaseID, Changes: &p.Changes,
		Owner: p.Owner, Agent: p.Agent, Message: p.Message, Keep: p.Keep, AllowDrops: p.Implicit})
	if res != nil {
		psp.Set("layer_id", res.LayerID)
		psp.Set("replayed", res.Replayed)
	}
	psp.End(err)
	d.recordPublish(ctx, publishOutcome{TxID: p.TxID, SessionID: p.SessionID, Agent: p.Agent, Owner: p.Owner, Message: p.Message,
		Source: preparedSource(p), Changes: &p.Changes, Result: res, Err: err})
	if err != nil {
		var ce *layerstack.ConflictError
		if errors.As(err, &ce) {
			// Another publish landed first on what this one changed: an
			// answer, not a failure (the workflow aborts and reports it,
			// as for a conflict found by prepare), so no step is retried
			// or logged as an error.
			return &api.PublishStepResult{Clean: false, WorkspaceSessionID: p.SessionID, TxID: p.TxID,
				Stage: "publish", SessionRetained: true, Rejection: rejection(ce)}, nil
		}
		return nil, err
	}
	p.Result = res
	if err := d.savePrepared(p); err != nil {
		return nil, err
	}
	d.event(ctx, "workspace_session.published", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID, "layer_id": res.LayerID, "no_op": res.NoOp})
	return &api.PublishStepResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID, Clean: true, Committed: true, Publish: publishJSON(res)}, nil
}

// publishFinalize closes the session after its commit: destroyed, or with
// keep moved onto the new head with an empty upper dir. Idempotent.
func (d *Daemon) publishFinalize(ctx context.Context, a api.PublishStepArgs) (_ *api.PublishFinalResult, retErr error) {
	ctx, sp := d.span(ctx, "workspace_session.finalize", map[string]any{"txid": a.TxID})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	unlockTx := d.lockTx(a.TxID)
	defer unlockTx()
	fin, err := d.finalizeLocked(ctx, a.TxID)
	var ae *api.Error
	if errors.As(err, &ae) && ae.Kind == api.KindNotFound && a.WorkspaceSessionID != "" {
		// No record (swept a day after the publish ended, or never
		// written): a publish the store committed is finalized from the
		// store's record, as an exactly-once retry is (replayCommit).
		if committed, cerr := d.store.Committed(a.TxID); cerr == nil && committed {
			res, err := d.replayCommit(ctx, api.PublishArgs{TxID: a.TxID, WorkspaceSessionID: a.WorkspaceSessionID, Keep: a.Keep})
			if err != nil {
				return nil, err
			}
			return &res.PublishFinalResult, nil
		}
	}
	return fin, err
}

// finalizeLocked is publishFinalize with the transaction's lock held.
func (d *Daemon) finalizeLocked(ctx context.Context, txid string) (*api.PublishFinalResult, error) {
	p, err := d.loadPrepared(txid)
	if err != nil {
		return nil, err
	}
	if p.Finalized != nil {
		return p.Finalized, nil // a retried finalize
	}
	if p.Aborted {
		return nil, errAborted(p)
	}
	if p.Result == nil {
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"txid": txid}, "publish %s is not committed yet", txid)
	}
	out := &api.PublishFinalResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID, Publish: publishJSON(p.Result)}
	s, err := d.lockLive(p.SessionID)
	if err != nil {
		out.Destroyed = true // the session went away with an earlier attempt
		return d.finalized(p, out)
	}
	defer s.gate.Unlock()
	if p.Keep {
		if p.stillOn(s) {
			if err := d.rebase(ctx, s, p.Result.LeaseID); err != nil {
				s.setState(StateFinalizeFailed)
				return nil, finalizeFailed(s, p.Result, d.confine(s, err))
			}
		}
		s.setState(StateActive)
		out.Destroyed, out.Kept = false, true
	} else {
		bytes, err := d.closeSession(ctx, s, leaseReleased)
		if err != nil {
			return nil, finalizeFailed(s, p.Result, d.confine(s, err))
		}
		out.Destroyed, out.EvictedUpperdirBytes = true, &bytes
	}
	return d.finalized(p, out)
}

// stillOn reports whether kept session s is still where publish p (with
// keep, committed) found it, so its finalize moves it onto the new head:
// on the upper dir the changes were captured from (a restart after the
// commit may have put it on the commit's lease already, over that upper
// dir), or for a record without the upper dir, not on the commit's lease.
// A session past it (moved, then published or refreshed again) is left as
// it is.
func (p *preparedPublish) stillOn(s *session) bool {
	if p.Upper != "" {
		return s.rec.Upper == p.Upper
	}
	return s.rec.LeaseID != p.Result.LeaseID
}

// finalized records finalize's answer: the frozen files go, the record
// stays (a day, see sweepTxns) so a retry gets the same answer.
func (d *Daemon) finalized(p *preparedPublish, out *api.PublishFinalResult) (*api.PublishFinalResult, error) {
	p.Finalized = out
	_ = os.RemoveAll(filepath.Join(d.txDir(p.TxID), "files"))
	p.Sources = nil
	if err := d.savePrepared(p); err != nil {
		return nil, err
	}
	return out, nil
}

// sweepTxns removes publish records finished more than a day ago.
func (d *Daemon) sweepTxns() {
	root := filepath.Join(d.cfg.StateDir, "txns")
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		var p preparedPublish
		name := filepath.Join(root, e.Name(), "prepared.json")
		fi, err := os.Stat(name)
		if err != nil || readJSON(name, &p) != nil {
			continue
		}
		if (p.Finalized != nil || p.Aborted) && time.Since(fi.ModTime()) > 24*time.Hour {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// publishAbort drops a prepared, uncommitted publish and gives the session
// back to its agent. A txid never prepared (its prepare failed, was
// rejected, or never arrived) is a no-op answer; the record it leaves makes
// a prepare still on its way refuse, so it cannot prepare after its abort.
// A publish that did commit is refused with details.committed: finalize it.
func (d *Daemon) publishAbort(ctx context.Context, a api.PublishStepArgs) (_ *api.PublishAbortResult, retErr error) {
	ctx, sp := d.span(ctx, "workspace_session.publish.abort", map[string]any{"txid": a.TxID, "workspace_session_id": a.WorkspaceSessionID})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	if a.TxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "txid is required")
	}
	unlockTx := d.lockTx(a.TxID)
	defer unlockTx()
	return d.abortLocked(ctx, a.TxID, a.WorkspaceSessionID, AbortedByWorkflow)
}

// Who aborted a publish (preparedPublish.AbortedBy, details.aborted_by).
const (
	AbortedByWorkflow = "workflow"
	AbortedByRecover  = "recover"
	AbortedByRestart  = "daemon_restart"
)

// abortLocked is publishAbort with the transaction's lock held.
func (d *Daemon) abortLocked(ctx context.Context, txid, sessionID, by string) (*api.PublishAbortResult, error) {
	p, err := d.loadPrepared(txid)
	if err != nil {
		if committed, cerr := d.store.Committed(txid); cerr != nil {
			return nil, cerr
		} else if committed {
			// Its record swept a day after it ended, or never written:
			// an abort must not record a committed publish as aborted.
			return nil, api.Errorf(api.KindOperationFailed, map[string]any{"txid": txid, "workspace_session_id": sessionID, "committed": true},
				"publish %s is committed; there is nothing to abort", txid)
		}
		// The record that refuses a late prepare is best effort: an abort
		// that changes nothing must not fail on a full volume.
		_ = os.RemoveAll(filepath.Join(d.txDir(txid), "files")) // a prepare that died freezing
		err := os.MkdirAll(d.txDir(txid), 0o700)
		if err == nil {
			err = d.savePrepared(&preparedPublish{TxID: txid, SessionID: sessionID, Aborted: true, AbortedBy: by})
		}
		if err != nil {
			d.log.Warn("publish abort: recording the abort of an unprepared txid failed", "txid", txid, "err", err)
		}
		return &api.PublishAbortResult{TxID: txid, WorkspaceSessionID: sessionID, Aborted: true, NotPrepared: true}, nil
	}
	if p.Aborted {
		return &api.PublishAbortResult{TxID: txid, WorkspaceSessionID: p.SessionID, Aborted: true, NotPrepared: p.LeaseID == ""}, nil
	}
	if p.Result == nil {
		// The store may have committed it without this record saying so
		// (a crash between the two): then it is committed.
		committed, err := d.store.Committed(txid)
		if err != nil {
			return nil, err
		}
		if committed {
			if err := d.recordCommit(ctx, p); err != nil {
				return nil, err
			}
		}
	}
	if p.Result != nil {
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"txid": txid, "workspace_session_id": p.SessionID, "committed": true},
			"publish %s is committed: finalize it", txid)
	}
	if p.Committing {
		// Written with a commit that did not happen: void, not aborted (a
		// retry of the txid publishes the session as if it never began).
		if err := d.voidUncommitted(p); err != nil {
			return nil, err
		}
		d.event(ctx, "workspace_session.publish.aborted", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID, "uncommitted": true})
		return &api.PublishAbortResult{TxID: txid, WorkspaceSessionID: p.SessionID, Aborted: true}, nil
	}
	if s, err := d.lockLive(p.SessionID); err == nil {
		if s.state == StatePublishing {
			s.setState(StateActive)
		}
		s.gate.Unlock()
	}
	p.Aborted, p.AbortedBy = true, by
	_ = os.RemoveAll(filepath.Join(d.txDir(p.TxID), "files"))
	p.Sources = nil
	if err := d.savePrepared(p); err != nil {
		return nil, err
	}
	d.event(ctx, "workspace_session.publish.aborted", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID})
	return &api.PublishAbortResult{TxID: txid, WorkspaceSessionID: p.SessionID, Aborted: true}, nil
}

// voidUncommitted drops the record of an exactly-once publish that did not
// commit (a daemon that died between writing it and the commit point) and
// gives its session back to its agent.
func (d *Daemon) voidUncommitted(p *preparedPublish) error {
	if s, err := d.lockLive(p.SessionID); err == nil {
		if s.state == StatePublishing {
			s.setState(StateActive)
		}
		s.gate.Unlock()
	}
	return os.RemoveAll(d.txDir(p.TxID))
}

// recordCommit fills in the result of a transaction the store committed
// but the daemon's record does not show: the store's replay of the same
// TxID returns it (and, with keep, the session's new lease) writing nothing.
func (d *Daemon) recordCommit(ctx context.Context, p *preparedPublish) error {
	res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: p.TxID, LeaseID: p.LeaseID, Changes: &p.Changes,
		Owner: p.Owner, Agent: p.Agent, Message: p.Message, Keep: p.Keep, AllowDrops: p.Implicit})
	if err != nil {
		return err
	}
	p.Result = res
	return d.savePrepared(p)
}

// copyRegular streams a captured write's source (opened beneath the upper
// dir, never by a path the session can swap) into dst (created, 0600).
func copyRegular(c layerstack.Change, dst string) error {
	in, _, err := c.OpenSource()
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
