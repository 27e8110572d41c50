package sandboxinit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// AbortedByVerify: a verified publish whose verification failed, whose
// head kept moving, or that conflicted.
const AbortedByVerify = "verify"

// checkVerify validates a verified publish's arguments (the workflow
// validated them too: this is the far side of the process boundary).
func checkVerify(v *api.PublishVerify) error {
	switch {
	case len(v.Cmd) == 0 || len(trimSpace(v.Cmd)) == 0:
		return api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "verify"}, "verify: the command is empty")
	case len(v.Cmd) > api.MaxVerifyCmdBytes:
		return api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "verify", "max_bytes": api.MaxVerifyCmdBytes}, "verify: the command is longer than %d bytes", api.MaxVerifyCmdBytes)
	case v.TimeoutMS < 1000 || v.TimeoutMS > api.MaxVerifyTimeoutS*1000:
		return api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "verify_timeout_s", "min": 1, "max": api.MaxVerifyTimeoutS},
			"verify_timeout_s must be between 1 and %d", api.MaxVerifyTimeoutS)
	case v.Retries < 0 || v.Retries > api.MaxVerifyRetries:
		return api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "verify_retries", "min": 0, "max": api.MaxVerifyRetries},
			"verify_retries must be between 0 and %d", api.MaxVerifyRetries)
	}
	return nil
}

func trimSpace(s string) string {
	i, j := 0, len(s)
	for i < j && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	for j > i && (s[j-1] == ' ' || s[j-1] == '\t' || s[j-1] == '\n' || s[j-1] == '\r') {
		j--
	}
	return s[i:j]
}

// publishVerified is publish_workspace_session with exactly_once and
// verify, with the transaction's lock held and nothing of it recorded or
// committed yet.
//
// The change set is captured and frozen under txns/ (as publish_prepare
// does) and recorded, and the session is "publishing" (its commands are
// refused) until the publish ends: what commits is exactly what was
// verified. Then, at most 1 + Retries times: the frozen change set is
// merged onto the current head in a throwaway session (a conflict is
// reported as a publish's, before anything runs), the command runs there,
// the throwaway session is removed; a failure ends the publish with its
// report; a pass commits onto exactly the head it verified, or, when
// another publish moved the head meanwhile, verifies again on the new one.
// Every path that does not commit aborts the record (the session is
// active again with its changes) and records the answer, which a retry
// gets. A daemon that dies meanwhile aborts the record at boot (or
// finalizes it, if the commit landed) and removes the throwaway session.
//
// The verification runs on a context the caller's disconnect does not
// cancel: a retried call waits for it (the txid's lock) and gets its answer.
func (d *Daemon) publishVerified(ctx context.Context, a api.PublishArgs) (_ *api.PublishTxResult, retErr error) {
	if err := checkVerify(a.Verify); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	ctx, sp := d.span(ctx, "workspace_session.publish.verified", map[string]any{"workspace_session_id": a.WorkspaceSessionID, "txid": a.TxID})
	defer func() { sp.End(retErr) }()
	p, err := d.prepareVerified(ctx, a)
	if err != nil {
		return nil, err
	}
	// From here every path ends the record: commit, or abort.
	end := func(ans *api.PublishTxResult, failure error) (*api.PublishTxResult, error) {
		if _, err := d.abortLocked(ctx, p.TxID, p.SessionID, AbortedByVerify); err != nil {
			d.log.Error("verified publish: abort failed", "txid", p.TxID, "err", err)
			if failure == nil {
				failure = err
			}
		}
		if ans != nil {
			if q, err := d.loadPrepared(p.TxID); err == nil {
				q.Answer = ans
				if err := d.savePrepared(q); err != nil {
					d.log.Warn("verified publish: recording the answer failed", "txid", p.TxID, "err", err)
				}
			}
		}
		return ans, failure
	}
	var rep *api.VerifyReport
	for attempt := 0; attempt <= a.Verify.Retries; attempt++ {
		var conflict *layerstack.ConflictError
		rep, conflict, err = d.verifyOnce(ctx, p, a.Verify, attempt)
		if conflict != nil {
			d.recordPublish(ctx, publishOutcome{TxID: p.TxID, SessionID: p.SessionID, Agent: p.Agent, Owner: p.Owner, Message: p.Message,
				Source: SourceSession, Changes: &p.Changes, Err: conflict})
			return end(&api.PublishTxResult{PublishFinalResult: api.PublishFinalResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID},
				Rejection: rejection(conflict)}, nil)
		}
		if err != nil {
			return end(nil, err)
		}
		sp.Set("attempts", attempt+1)
		if !rep.Passed {
			d.event(ctx, "workspace_session.publish.verify_failed", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID, "status": rep.Status})
			return end(&api.PublishTxResult{PublishFinalResult: api.PublishFinalResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID}, Verify: rep}, nil)
		}
		res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: p.TxID, LeaseID: p.LeaseID, Changes: &p.Changes,
			Owner: p.Owner, Agent: p.Agent, Message: p.Message, Keep: p.Keep, ExpectVersion: rep.VerifiedHead.ManifestVersion})
		var moved *layerstack.HeadMovedError
		if errors.As(err, &moved) {
			d.event(ctx, "workspace_session.publish.head_moved", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID,
				"verified": rep.VerifiedHead.ManifestVersion, "head": moved.Head.ManifestVersion})
			continue // merge onto the new head and verify again
		}
		d.recordPublish(ctx, publishOutcome{TxID: p.TxID, SessionID: p.SessionID, Agent: p.Agent, Owner: p.Owner, Message: p.Message,
			Source: SourceSession, Changes: &p.Changes, Result: res, Err: err})
		if errors.As(err, &conflict) {
			return end(&api.PublishTxResult{PublishFinalResult: api.PublishFinalResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID},
				Rejection: rejection(conflict)}, nil)
		}
		if err != nil {
			return end(nil, err)
		}
		p.Result = res
		if err := d.savePrepared(p); err != nil {
			// Committed: the boot reconcile or a retry (the store knows the
			// txid) finalizes it.
			return nil, err
		}
		d.event(ctx, "workspace_session.published", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID, "layer_id": res.LayerID, "verified": true})
		fin, err := d.finalizeLocked(ctx, p.TxID)
		if err != nil {
			return nil, err
		}
		return &api.PublishTxResult{PublishFinalResult: *fin, Clean: true, Verify: rep}, nil
	}
	return end(&api.PublishTxResult{PublishFinalResult: api.PublishFinalResult{TxID: p.TxID, WorkspaceSessionID: p.SessionID},
		Verify: rep, HeadKeptMoving: true}, nil)
}

// prepareVerified captures and freezes the session's change set, records
// it and puts the session in "publishing".
func (d *Daemon) prepareVerified(ctx context.Context, a api.PublishArgs) (*preparedPublish, error) {
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
	release()
	p.Changes = *cs
	if err := d.savePrepared(p); err != nil {
		return nil, d.stepFailed(s, "prepare", err)
	}
	keep = true
	s.setState(StatePublishing)
	return p, nil
}

// verifyOnce merges p's frozen change set onto the current head in a
// throwaway session with the publishing session's network and limits, runs
// v.Cmd there and removes the session. A conflict with the head is
// returned as such, before anything runs.
func (d *Daemon) verifyOnce(ctx context.Context, p *preparedPublish, v *api.PublishVerify, attempt int) (*api.VerifyReport, *layerstack.ConflictError, error) {
	of, err := d.session(p.SessionID)
	if err != nil {
		return nil, nil, err
	}
	release, err := d.admitSession()
	if err != nil {
		return nil, nil, err
	}
	defer release()
	tw := &session{state: StateActive, rec: sessionRecord{ID: newSessionID(), NetworkProfile: of.rec.NetworkProfile, Agent: "verify:" + of.rec.ID,
		Upper: "upper-0", Limits: of.rec.Limits, Egress: of.rec.Egress, Created: time.Now().UTC(), VerifyTxID: p.TxID, Anchored: true}}
	tw.dir = filepath.Join(d.cfg.StateDir, "sessions", tw.rec.ID)
	ctx, sp := d.span(ctx, "workspace_session.verify", map[string]any{"workspace_session_id": p.SessionID, "txid": p.TxID,
		"throwaway_session_id": tw.rec.ID, "attempt": attempt + 1})
	defer func() { sp.End(err) }()
	if err = os.MkdirAll(tw.dir, 0o755); err != nil {
		return nil, nil, err
	}
	staged, err := d.store.StageOnHead(ctx, p.LeaseID, &p.Changes, tw.upper(), tw.owner())
	var ce *layerstack.ConflictError
	if errors.As(err, &ce) {
		_ = os.RemoveAll(tw.dir)
		return nil, ce, nil
	}
	if err != nil {
		_ = os.RemoveAll(tw.dir)
		return nil, nil, err
	}
	tw.setUpperLease(tw.rec.Upper, staged.LeaseID)
	defer func() {
		if _, terr := d.teardown(context.WithoutCancel(ctx), tw, true); terr != nil {
			d.log.Error("removing a verification's throwaway session failed", "workspace_session_id", tw.rec.ID, "err", terr)
		}
	}()
	for _, sub := range []string{"work", "merged"} {
		if err = os.MkdirAll(filepath.Join(tw.dir, sub), 0o755); err != nil {
			return nil, nil, err
		}
	}
	if err = tw.save(); err != nil {
		return nil, nil, err
	}
	lease, err := d.store.Lease(staged.LeaseID)
	if err != nil {
		return nil, nil, err
	}
	if err = d.start(ctx, tw, lease); err != nil {
		return nil, nil, err
	}
	tw.act.touch()
	d.mu.Lock()
	d.sessions[tw.rec.ID] = tw
	d.mu.Unlock()
	rep := &api.VerifyReport{VerifiedHead: revisionJSON(staged.Revision), Attempts: attempt + 1}
	sp.Set("verified_head", staged.Revision.ManifestVersion)
	start := time.Now()
	timeout := v.TimeoutMS
	yield := min(timeout+2000, int64(api.MaxYieldTimeMS))
	out, err := d.exec(ctx, api.ExecCommandArgs{WorkspaceSessionID: tw.rec.ID, Cmd: v.Cmd, TimeoutMS: &timeout, YieldTimeMS: &yield})
	if err != nil {
		return nil, nil, err
	}
	var tail tailBuffer
	for {
		tail.add(out.Output)
		if out.Status != api.StatusRunning {
			break
		}
		if out, err = d.cmds.WriteStdin(ctx, api.WriteCommandStdinArgs{CommandSessionID: out.CommandSessionID, YieldTimeMS: &yield}); err != nil {
			return nil, nil, err
		}
	}
	rep.Status, rep.ExitCode = out.Status, out.ExitCode
	rep.OutputTail, rep.OutputTruncated = tail.String()
	rep.WallTimeMS = time.Since(start).Milliseconds()
	rep.Passed = out.Status == api.StatusOK && out.ExitCode != nil && *out.ExitCode == 0
	sp.Set("passed", rep.Passed)
	return rep, nil, nil
}

// removeThrowaway removes a verification's throwaway session found at boot
// (its verification died with the daemon).
func (d *Daemon) removeThrowaway(ctx context.Context, s *session) {
	if err := d.restore(ctx, s); err != nil {
		d.log.Warn("restoring a throwaway session to remove it failed; removing its files", "workspace_session_id", s.rec.ID, "err", err)
	}
	if _, err := d.teardown(ctx, s, true); err != nil {
		d.log.Error("removing a throwaway verification session at boot failed", "workspace_session_id", s.rec.ID, "err", err)
		return
	}
	d.log.Info("removed a verification's throwaway session at boot", "workspace_session_id", s.rec.ID, "txid", s.rec.VerifyTxID)
}

// tailBuffer keeps the last api.VerifyOutputTailBytes of what it is given.
type tailBuffer struct {
	b         []byte
	truncated bool
}

func (t *tailBuffer) add(s string) {
	if s == "" {
		return
	}
	if len(t.b) > 0 && t.b[len(t.b)-1] != '\n' {
		t.b = append(t.b, '\n')
	}
	t.b = append(t.b, s...)
	if n := len(t.b) - api.VerifyOutputTailBytes; n > 0 {
		t.b = append(t.b[:0:0], t.b[n:]...)
		t.truncated = true
	}
}

func (t *tailBuffer) String() (string, bool) { return string(t.b), t.truncated }
