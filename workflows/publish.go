package workflows

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// versionPublishSettles marks runs in which every publish that did not
// commit ends with an abort (also after a failed prepare), and abort and
// finalize retry on a disconnected context until they succeed. Runs
// recorded before replay the old steps (an abort only after a rejection or
// a failed commit, its error logged).
const versionPublishSettles = "publish-settles"

// PublishWorkflow publishes one session's change set exactly once:
// prepare (capture and freeze, dry run), commit, finalize. Each step is
// idempotent at the daemon by the transaction id (this workflow's id), so a
// step retried after a worker or daemon crash converges on one layer.
//
// Every path that does not commit ends with abort, so no session is left
// in "publishing": a rejection, a failed prepare (the daemon's abort of a
// txid it never prepared is a no-op) or a commit that failed or could not
// be reached. Abort and finalize run on a disconnected context and retry
// (settleOptions) until the daemon answers; a daemon that comes back after
// the workflow gave up settles its prepared publishes itself at boot. A
// daemon that restarted between prepare and commit has aborted the publish
// that way (nothing committed, the session active with its changes): the
// workflow then starts over under a derived txid, at most
// maxPublishRestarts times.
//
// Every failure is the daemon's own *api.Error, unwrapped (a refusal at
// prepare reaches the client with the daemon's kind, message and details).
func PublishWorkflow(ctx workflow.Context, in PublishInput) (*api.PublishFinalResult, error) {
	// The step in progress, for callers that show progress; a query adds
	// no event to the history, so replay is unaffected.
	progress := PublishProgress{SessionID: in.SessionID, Step: "starting"}
	if err := workflow.SetQueryHandler(ctx, QueryPublishProgress, func() (PublishProgress, error) { return progress, nil }); err != nil {
		return nil, err
	}
	p := &publication{ctx: ctx, progress: &progress, run: daemonOptions(ctx, hostQueue(in.HostQueue))}
	p.settles = workflow.GetVersion(ctx, versionPublishSettles, workflow.DefaultVersion, 1) != workflow.DefaultVersion
	p.settle = p.run
	if !p.settles {
		return p.once(in)
	}
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	p.settle = settleOptions(dctx, hostQueue(in.HostQueue))
	for attempt := 0; ; attempt++ {
		try := in
		if attempt > 0 {
			try.TxID = fmt.Sprintf("%s/again-%d", in.TxID, attempt)
		}
		fin, err := p.once(try)
		// A daemon that restarted between prepare and commit aborted the
		// prepared publish (its boot reconcile leaves no session
		// publishing): nothing was committed and the session is active
		// with its changes, so the publish starts over under a new txid.
		if attempt < maxPublishRestarts && abortedByDaemon(err) {
			workflow.GetLogger(ctx).Info("publish aborted by its daemon; starting over", "txid", try.TxID, "attempt", attempt+1)
			continue
		}
		return fin, err
	}
}

// maxPublishRestarts bounds how often a publish starts over after its
// daemon aborted it (each time the daemon restarted mid-publish).
const maxPublishRestarts = 3

// publication runs the steps of one publish.
type publication struct {
	ctx      workflow.Context
	progress *PublishProgress
	settles  bool
	// run: prepare and commit; settle: abort and finalize (disconnected,
	// retried until the daemon answers, when settles).
	run, settle workflow.Context
}

// abortedByDaemon: a step was refused because the daemon, restarted
// between prepare and commit, aborted the publish at boot (not because
// recover_workspace_session ended it on purpose).
func abortedByDaemon(err error) bool {
	e, ok := apperr.From(err)
	return ok && e.Details["aborted"] == true && e.Details["aborted_by"] == "daemon_restart" && e.Details["abort_failed"] == nil
}

func (p *publication) step(sctx workflow.Context, in PublishInput, op string, out any) error {
	p.progress.Step = op
	args, err := json.Marshal(api.PublishStepArgs{WorkspaceSessionID: in.SessionID, TxID: in.TxID, Keep: in.Keep, Message: in.Message})
	if err != nil {
		return err
	}
	rid := in.TxID + "/" + op
	if in.RequestID != "" {
		rid += "/" + in.RequestID
	}
	call := DaemonCall{SandboxID: in.SandboxID, Daemon: in.Daemon, Op: op, Args: args, RequestID: rid}
	var raw json.RawMessage
	if err := workflow.ExecuteActivity(sctx, ActCallDaemon, call).Get(sctx, &raw); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return apperr.Newf(api.KindInternal, map[string]any{"op": op}, "the daemon's answer to %s does not decode: %v", op, err)
	}
	return nil
}

func (p *publication) finalize(in PublishInput) (*api.PublishFinalResult, error) {
	var fin api.PublishFinalResult
	if err := p.step(p.settle, in, "publish_finalize", &fin); err != nil {
		return nil, err
	}
	return &fin, nil
}

// abort ends a publish that did not commit and returns failure, the error
// the publish fails with. A daemon that answers that the publish did commit
// after all (a commit whose answer was lost) is finalized instead.
func (p *publication) abort(in PublishInput, failure error) (*api.PublishFinalResult, error) {
	var ab api.PublishAbortResult
	err := p.step(p.settle, in, "publish_abort", &ab)
	if err == nil {
		return nil, failure
	}
	workflow.GetLogger(p.ctx).Error("publish abort failed", "txid", in.TxID, "error", err)
	if !p.settles {
		return nil, failure
	}
	if e, ok := apperr.From(err); ok && e.Details["committed"] == true {
		return p.finalize(in)
	}
	return nil, abortFailed(failure, err, in)
}

// once runs prepare, commit and finalize of transaction in.TxID.
func (p *publication) once(in PublishInput) (*api.PublishFinalResult, error) {
	var prep api.PublishStepResult
	if err := p.step(p.run, in, "publish_prepare", &prep); err != nil {
		if p.settles {
			// The prepare may have run at the daemon even though its answer
			// never arrived.
			return p.abort(in, err)
		}
		return nil, err
	}
	if prep.Publish != nil {
		p.progress.Changes = prep.Publish.Counts.Files + prep.Publish.Counts.Dirs + prep.Publish.Counts.Symlinks + prep.Publish.Counts.Deletes
	}
	if prep.Rejected() {
		return p.abort(in, rejected(&prep, in))
	}
	var commit api.PublishStepResult
	if err := p.step(p.run, in, "publish_commit", &commit); err != nil {
		return p.abort(in, err)
	}
	// A commit can still lose to a publish that landed after prepare: the
	// daemon then answers clean false with the conflicts.
	if commit.Rejected() {
		return p.abort(in, rejected(&commit, in))
	}
	return p.finalize(in)
}

// rejected is the non-retryable error that carries the daemon's conflict
// report, after the publish was aborted (the session goes back to its
// agent).
func rejected(r *api.PublishStepResult, in PublishInput) error {
	n := len(r.Conflicts)
	// Details copies a map into a map: the result does not depend on the
	// order it iterates in.
	//workflowcheck:ignore
	return apperr.New(api.Errorf(api.KindOperationFailed,
		r.Rejection.Details(map[string]any{"stage": "publish", "session_retained": true, "txid": in.TxID, "workspace_session_id": in.SessionID}),
		"publish rejected: %d conflicting path(s) with the head; nothing was committed", n))
}

// abortFailed is failure, the publish's own error, saying also that its
// abort failed: the session may still be publishing, and
// recover_workspace_session brings it back.
func abortFailed(failure, abortErr error, in PublishInput) error {
	e, ok := apperr.From(failure)
	if !ok {
		e = api.Errorf(api.KindOperationFailed, nil, "publish %s failed: %v", in.TxID, failure)
	}
	// e was decoded from the failure for this call: adding to its details
	// changes no one else's.
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details["abort_failed"] = abortErr.Error()
	e.Details["workspace_session_id"] = in.SessionID
	e.Details["txid"] = in.TxID
	e.Details["recovery_operation"] = "recover_workspace_session"
	return apperr.New(&api.Error{Kind: e.Kind, Message: e.Message + "; aborting the publish failed too", Details: e.Details})
}

func hostQueue(q string) string {
	if q == "" {
		return TaskQueue
	}
	return q
}

// versionPublishOneActivity marks runs in which a publish is one
// exactly-once daemon call from the sandbox workflow's update handler
// (publishTx) instead of a PublishWorkflow child running prepare, commit
// and finalize. Runs recorded before replay the child.
const versionPublishOneActivity = "publish-one-activity"

// MemoLastPublish is the sandbox workflow's memo key holding its latest
// publish (a PublishRecord); every publish upserts it, so the workflow's
// history holds one record per publish (WorkflowPropertiesModified).
const MemoLastPublish = "last_publish"

// PublishRecord is what the sandbox workflow records of one publish.
type PublishRecord struct {
	TxID               string `json:"txid"`
	WorkspaceSessionID string `json:"workspace_session_id"`
	UpdateID           string `json:"update_id,omitempty"`
	// Outcome: committed, no_op, rejected or failed.
	Outcome         string    `json:"outcome"`
	LayerID         string    `json:"layer_id,omitempty"`
	ManifestVersion int64     `json:"manifest_version,omitempty"`
	Conflicts       int       `json:"conflicts,omitempty"`
	Error           string    `json:"error,omitempty"`
	Verified        bool      `json:"verified,omitempty"`
	At              time.Time `json:"at"`
	Publishes       int       `json:"publishes"`
}

// publishTx publishes one session as one activity: the daemon's
// publish_workspace_session with exactly_once under the transaction id
// txid (the id the child workflow had), which the daemon commits once
// however often the activity is retried (a worker or daemon crash), and
// answers as the first time. The daemon closes a session that is not kept
// after it answered, so finalize is off this path. Outcomes and result
// shapes are the child's: the finalize result, the same rejection error,
// the daemon's refusals unwrapped.
func (s *sandbox) publishTx(ctx workflow.Context, r PublishRequest, txid string) (json.RawMessage, error) {
	return s.publishCall(daemonOptions(ctx, s.queue()), r, txid, nil, 0)
}

// publishCall runs the daemon's exactly-once publish (verified when v is
// set; timeout bounds the call, 0 the client's default) on the activity
// options of actx.
func (s *sandbox) publishCall(actx workflow.Context, r PublishRequest, txid string, v *api.PublishVerify, timeout time.Duration) (json.RawMessage, error) {
	ctx := actx
	updateID := workflow.GetCurrentUpdateInfo(ctx).ID
	args, err := json.Marshal(api.PublishArgs{WorkspaceSessionID: r.WorkspaceSessionID, TxID: txid, Keep: r.Keep, Message: r.Message, ExactlyOnce: true, Verify: v})
	if err != nil {
		return nil, err
	}
	rid := txid + "/publish"
	if updateID != "" {
		rid += "/" + updateID
	}
	call := DaemonCall{SandboxID: s.id(), Daemon: s.state.Container.Daemon, Direct: s.state.Container.DaemonDirect, Op: UpdatePublish, Args: args, RequestID: rid, Timeout: timeout}
	rec := PublishRecord{TxID: txid, WorkspaceSessionID: r.WorkspaceSessionID, UpdateID: updateID, Verified: v != nil}
	var raw json.RawMessage
	run := s.callDaemon
	if v != nil {
		// A verified publish runs the tests: it stays a regular activity,
		// never holding the sandbox's workflow task.
		run = func(ctx, actx workflow.Context, call DaemonCall, out *json.RawMessage) error {
			return workflow.ExecuteActivity(actx, ActCallDaemon, call).Get(ctx, out)
		}
	}
	if err := run(ctx, actx, call, &raw); err != nil {
		err = unwrapChild(err)
		rec.Outcome, rec.Error = "failed", err.Error()
		s.recordPublish(ctx, rec)
		return nil, err
	}
	var res api.PublishTxResult
	if err := decode(UpdatePublish, raw, &res); err != nil {
		return nil, err
	}
	if res.Rejected() {
		rec.Outcome, rec.Conflicts = "rejected", len(res.Conflicts)
		s.recordPublish(ctx, rec)
		return nil, rejected(&api.PublishStepResult{Rejection: res.Rejection}, PublishInput{TxID: txid, SessionID: r.WorkspaceSessionID})
	}
	if !res.Clean && res.Verify != nil {
		rec.Outcome = "verify_failed"
		if res.HeadKeptMoving {
			rec.Outcome = "head_kept_moving"
		}
		s.recordPublish(ctx, rec)
		return nil, verifyRejected(&res, v, txid, r.WorkspaceSessionID)
	}
	if res.Publish == nil {
		return nil, apperr.Newf(api.KindInternal, map[string]any{"op": UpdatePublish, "txid": txid}, "the daemon's answer to %s has no publish", UpdatePublish)
	}
	var out []byte
	if v != nil {
		out, err = json.Marshal(verifiedResult{PublishFinalResult: res.PublishFinalResult, Verify: res.Verify})
	} else {
		out, err = json.Marshal(res.PublishFinalResult)
	}
	if err != nil {
		return nil, err
	}
	s.state.Publishes++
	if !r.Keep {
		delete(s.state.Sessions, r.WorkspaceSessionID)
	}
	rec.Outcome, rec.LayerID, rec.ManifestVersion = "committed", res.Publish.LayerID, res.Publish.Revision.ManifestVersion
	if res.Publish.NoOp {
		rec.Outcome = "no_op"
	}
	s.recordPublish(ctx, rec)
	return out, nil
}

// memoEvery is how far the last_publish memo may lag its publish: a memo
// upsert is a visibility write (measured: a sixth of the embedded
// Temporal's CPU per publish), so publishes that follow each other
// closer than this share one.
const memoEvery = time.Second

// versionMemoCoalesced marks runs whose last_publish memo is upserted at
// most once per memoEvery (runs recorded before upserted it per publish).
const versionMemoCoalesced = "memo-coalesced"

// recordPublish records rec as the sandbox's last publish: at once in the
// workflow (the last_publish query, which the gateway's workflows view
// reads), and in the workflow's last_publish memo at once when the last
// upsert is memoEvery old, else when it is (one timer for all the
// publishes in between). A memo that cannot be written is logged: the
// publish itself stands. The history keeps every publish anyway: its
// update's accepted and completed events.
func (s *sandbox) recordPublish(ctx workflow.Context, rec PublishRecord) {
	rec.At, rec.Publishes = workflow.Now(ctx).UTC(), s.state.Publishes
	s.lastPublish = &rec
	if workflow.GetVersion(ctx, versionMemoCoalesced, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		s.upsertLastPublish(ctx, rec)
		return
	}
	s.memoPending = true
	if s.memoTimer {
		return // the timer upserts the latest
	}
	wait := memoEvery - workflow.Now(ctx).Sub(s.memoAt)
	if wait <= 0 {
		s.flushLastPublish(ctx)
		return
	}
	s.memoTimer = true
	workflow.Go(ctx, func(ctx workflow.Context) {
		_ = workflow.Sleep(ctx, wait)
		s.memoTimer = false
		s.flushLastPublish(ctx)
	})
}

// flushLastPublish upserts the memo if a publish since the last upsert
// has not been (before a continue-as-new or the end of the run too).
func (s *sandbox) flushLastPublish(ctx workflow.Context) {
	if !s.memoPending || s.lastPublish == nil {
		return
	}
	s.memoPending, s.memoAt = false, workflow.Now(ctx)
	s.upsertLastPublish(ctx, *s.lastPublish)
}

func (s *sandbox) upsertLastPublish(ctx workflow.Context, rec PublishRecord) {
	if err := workflow.UpsertMemo(ctx, map[string]interface{}{MemoLastPublish: rec}); err != nil {
		s.log.Error("recording the publish in the memo failed", "txid", rec.TxID, "error", err)
	}
}

// verifiedResult is a verified publish's result: the publish's, plus the
// verification that let it commit.
type verifiedResult struct {
	api.PublishFinalResult
	Verify *api.VerifyReport `json:"verify,omitempty"`
}

// validateVerify checks a verified publish's arguments before the update
// is accepted (bad input changes nothing: not even the publish sequence).
func validateVerify(r PublishRequest) error {
	if r.Verify == nil {
		return nil
	}
	bad := func(arg, format string, a ...any) error {
		return apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": arg, "op": UpdatePublish}, format, a...)
	}
	if strings.TrimSpace(*r.Verify) == "" {
		return bad("verify", "verify: the command is empty")
	}
	if len(*r.Verify) > api.MaxVerifyCmdBytes {
		return bad("verify", "verify: the command is longer than %d bytes", api.MaxVerifyCmdBytes)
	}
	if t := r.VerifyTimeoutS; t != nil && (*t < 1 || *t > api.MaxVerifyTimeoutS) {
		return bad("verify_timeout_s", "verify_timeout_s must be between 1 and %d (seconds), not %d", api.MaxVerifyTimeoutS, *t)
	}
	if n := r.VerifyRetries; n != nil && (*n < 0 || *n > api.MaxVerifyRetries) {
		return bad("verify_retries", "verify_retries must be between 0 and %d, not %d", api.MaxVerifyRetries, *n)
	}
	return nil
}

// publishVerified queues a verified publish behind the sandbox's others
// (they run one at a time, in the order the workflow accepted them; the
// queue is in the state, so the snapshot shows it) and runs it as one
// exactly-once daemon call. A publish without verify does not queue: it
// may commit while a verified one runs, which then finds the head moved
// and verifies again on the new head.
func (s *sandbox) publishVerified(ctx workflow.Context, r PublishRequest, txid string) (json.RawMessage, error) {
	q := &QueuedPublish{WorkspaceSessionID: r.WorkspaceSessionID, TxID: txid, UpdateID: workflow.GetCurrentUpdateInfo(ctx).ID,
		State: "queued", EnqueuedAt: workflow.Now(ctx).UTC()}
	s.state.PublishQueue = append(s.state.PublishQueue, q)
	s.renumberQueue()
	defer func() {
		for i, e := range s.state.PublishQueue {
			if e == q {
				s.state.PublishQueue = append(s.state.PublishQueue[:i:i], s.state.PublishQueue[i+1:]...)
				break
			}
		}
		s.renumberQueue()
	}()
	if err := workflow.Await(ctx, func() bool { return s.state.PublishQueue[0] == q }); err != nil {
		return nil, err
	}
	started := workflow.Now(ctx).UTC()
	q.State, q.StartedAt = "verifying", &started
	v := &api.PublishVerify{Cmd: *r.Verify, TimeoutMS: api.DefaultVerifyTimeoutS * 1000, Retries: api.DefaultVerifyRetries}
	if r.VerifyTimeoutS != nil {
		v.TimeoutMS = *r.VerifyTimeoutS * 1000
	}
	if r.VerifyRetries != nil {
		v.Retries = int(*r.VerifyRetries)
	}
	// Every attempt may run the command to its limit, plus the throwaway
	// sessions and the commit.
	budget := time.Duration(v.TimeoutMS)*time.Millisecond*time.Duration(v.Retries+1) + 5*time.Minute
	return s.publishCall(verifyOptions(ctx, s.queue(), budget), r, txid, v, budget)
}

func (s *sandbox) renumberQueue() {
	for i, e := range s.state.PublishQueue {
		e.Position = i + 1
	}
}

// verifyRejected is the error of a verified publish that did not commit:
// the command failed on the would-be head (operation_failed, stage verify,
// with its exit code and output), or the head kept moving under it
// (operation_conflict, reason head_kept_moving). The session keeps its
// changes.
func verifyRejected(res *api.PublishTxResult, v *api.PublishVerify, txid, sessionID string) error {
	rep := res.Verify
	det := map[string]any{"stage": "verify", "session_retained": true, "txid": txid, "workspace_session_id": sessionID,
		"exit_code": rep.ExitCode, "status": rep.Status, "output_tail": rep.OutputTail, "verified_head": rep.VerifiedHead,
		"attempts": rep.Attempts, "verify": v.Cmd}
	if rep.OutputTruncated {
		det["output_truncated"] = true
	}
	if res.HeadKeptMoving {
		det["reason"] = "head_kept_moving"
		return apperr.New(api.Errorf(api.KindOperationConflict, det,
			"verified publish rejected: the head moved during each of %d verification(s); nothing was committed, publish again", rep.Attempts))
	}
	det["reason"] = "verify_failed"
	why := "failed"
	switch {
	case rep.Status == api.StatusTimedOut:
		why = fmt.Sprintf("timed out after %d s", v.TimeoutMS/1000)
	case rep.ExitCode != nil:
		why = fmt.Sprintf("exited %d", *rep.ExitCode)
	}
	return apperr.New(api.Errorf(api.KindOperationFailed, det,
		"verified publish rejected: the verify command %s on the would-be head (manifest version %d); nothing was committed and the session keeps its changes",
		why, rep.VerifiedHead.ManifestVersion))
}
