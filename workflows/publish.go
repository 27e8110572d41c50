package workflows

import (
	"encoding/json"

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
// the workflow gave up settles its prepared publishes itself at boot.
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
	settles := workflow.GetVersion(ctx, versionPublishSettles, workflow.DefaultVersion, 1) != workflow.DefaultVersion
	run := daemonOptions(ctx, hostQueue(in.HostQueue))
	settle := run
	if settles {
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		settle = settleOptions(dctx, hostQueue(in.HostQueue))
	}
	step := func(sctx workflow.Context, op string, out any) error {
		progress.Step = op
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
	finalize := func() (*api.PublishFinalResult, error) {
		var fin api.PublishFinalResult
		if err := step(settle, "publish_finalize", &fin); err != nil {
			return nil, err
		}
		return &fin, nil
	}
	// abort ends a publish that did not commit and returns failure, the
	// error the publish fails with. A daemon that answers that the publish
	// did commit after all (a commit whose answer was lost) is finalized
	// instead.
	abort := func(failure error) (*api.PublishFinalResult, error) {
		var ab api.PublishAbortResult
		err := step(settle, "publish_abort", &ab)
		if err == nil {
			return nil, failure
		}
		workflow.GetLogger(ctx).Error("publish abort failed", "txid", in.TxID, "error", err)
		if !settles {
			return nil, failure
		}
		if e, ok := apperr.From(err); ok && e.Details["committed"] == true {
			return finalize()
		}
		return nil, abortFailed(failure, err, in)
	}

	var prep api.PublishStepResult
	if err := step(run, "publish_prepare", &prep); err != nil {
		if settles {
			// The prepare may have run at the daemon even though its answer
			// never arrived.
			return abort(err)
		}
		return nil, err
	}
	if prep.Publish != nil {
		progress.Changes = prep.Publish.Counts.Files + prep.Publish.Counts.Dirs + prep.Publish.Counts.Symlinks + prep.Publish.Counts.Deletes
	}
	if prep.Rejected() {
		return abort(rejected(&prep, in))
	}
	var commit api.PublishStepResult
	if err := step(run, "publish_commit", &commit); err != nil {
		return abort(err)
	}
	// A commit can still lose to a publish that landed after prepare: the
	// daemon then answers clean false with the conflicts.
	if commit.Rejected() {
		return abort(rejected(&commit, in))
	}
	return finalize()
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
