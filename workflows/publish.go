package workflows

import (
	"encoding/json"

	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// PublishWorkflow publishes one session's change set exactly once:
// prepare (capture and freeze, dry run), commit, finalize. Each step is
// idempotent at the daemon by the transaction id (this workflow's id), so a
// step retried after a worker or daemon crash converges on one layer. A
// rejected commit is aborted so the session goes back to its agent, and the
// workflow fails with the daemon's conflict report.
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
	step := func(op string, out any) error {
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
		if err := workflow.ExecuteActivity(daemonOptions(ctx, hostQueue(in.HostQueue)), ActCallDaemon, call).Get(ctx, &raw); err != nil {
			return err
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return apperr.Newf(api.KindInternal, map[string]any{"op": op}, "the daemon's answer to %s does not decode: %v", op, err)
		}
		return nil
	}
	abort := func() {
		var ab api.PublishAbortResult
		if err := step("publish_abort", &ab); err != nil {
			workflow.GetLogger(ctx).Error("publish abort failed", "txid", in.TxID, "error", err)
		}
	}
	var prep api.PublishStepResult
	if err := step("publish_prepare", &prep); err != nil {
		return nil, err
	}
	if prep.Publish != nil {
		progress.Changes = prep.Publish.Counts.Files + prep.Publish.Counts.Dirs + prep.Publish.Counts.Symlinks + prep.Publish.Counts.Deletes
	}
	if prep.Rejected() {
		abort()
		return nil, rejected(&prep, in)
	}
	var commit api.PublishStepResult
	if err := step("publish_commit", &commit); err != nil {
		abort()
		return nil, err
	}
	// A commit can still lose to a publish that landed after prepare: the
	// daemon then answers clean false with the conflicts.
	if commit.Rejected() {
		abort()
		return nil, rejected(&commit, in)
	}
	var fin api.PublishFinalResult
	if err := step("publish_finalize", &fin); err != nil {
		return nil, err
	}
	return &fin, nil
}

// rejected is the non-retryable error that carries the daemon's conflict
// report, after the publish was aborted (the session goes back to its
// agent).
func rejected(r *api.PublishStepResult, in PublishInput) error {
	n := len(r.Conflicts)
	return apperr.New(api.Errorf(api.KindOperationFailed,
		r.Rejection.Details(map[string]any{"stage": "publish", "session_retained": true, "txid": in.TxID, "workspace_session_id": in.SessionID}),
		"publish rejected: %d conflicting path(s) with the head; nothing was committed", n))
}

func hostQueue(q string) string {
	if q == "" {
		return TaskQueue
	}
	return q
}
