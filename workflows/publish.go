package workflows

import (
	"encoding/json"
	"fmt"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/activities"
)

// PublishWorkflow publishes one session's change set exactly once:
// prepare (capture and freeze, dry run), commit, finalize. Each step is
// idempotent at the daemon by the transaction id (this workflow's id), so a
// step retried after a worker or daemon crash converges on one layer. A
// rejected commit is aborted so the session goes back to its agent, and the
// workflow fails with the daemon's conflict report.
func PublishWorkflow(ctx workflow.Context, in PublishInput) (json.RawMessage, error) {
	// The step in progress, for callers that show progress; a query adds
	// no event to the history, so replay is unaffected.
	progress := PublishProgress{SessionID: in.SessionID, Step: "starting"}
	if err := workflow.SetQueryHandler(ctx, QueryPublishProgress, func() (PublishProgress, error) { return progress, nil }); err != nil {
		return nil, err
	}
	step := func(op string) (json.RawMessage, error) {
		progress.Step = op
		args, _ := json.Marshal(map[string]any{"workspace_session_id": in.SessionID, "txid": in.TxID, "keep": in.Keep, "message": in.Message})
		rid := in.TxID + "/" + op
		if in.RequestID != "" {
			rid += "/" + in.RequestID
		}
		call := activities.DaemonCall{SandboxID: in.SandboxID, Daemon: in.Daemon, Op: op, Args: args, RequestID: rid}
		var out json.RawMessage
		err := workflow.ExecuteActivity(daemonOptions(ctx, hostQueue(in.HostQueue)), acts.CallDaemon, call).Get(ctx, &out)
		return out, err
	}
	prep, err := step("publish_prepare")
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	var p struct {
		Clean   bool `json:"clean"`
		Publish struct {
			Counts struct{ Files, Dirs, Symlinks, Deletes int } `json:"counts"`
		} `json:"publish"`
	}
	_ = json.Unmarshal(prep, &p)
	c := p.Publish.Counts
	progress.Changes = c.Files + c.Dirs + c.Symlinks + c.Deletes
	if !p.Clean {
		return nil, rejected(step, prep, in)
	}
	commit, err := step("publish_commit")
	if err != nil {
		_, _ = step("publish_abort")
		return nil, err
	}
	// A commit can still lose to a publish that landed after prepare: the
	// daemon then answers clean false with the conflicts (older daemons
	// answered an error, handled above).
	var cm struct {
		Clean *bool `json:"clean"`
	}
	if _ = json.Unmarshal(commit, &cm); cm.Clean != nil && !*cm.Clean {
		return nil, rejected(step, commit, in)
	}
	return step("publish_finalize")
}

// rejected aborts the publish (the session goes back to its agent) and
// returns the non-retryable error that carries the daemon's conflict report.
func rejected(step func(string) (json.RawMessage, error), answer json.RawMessage, in PublishInput) error {
	_, _ = step("publish_abort")
	var det map[string]any
	_ = json.Unmarshal(answer, &det)
	return temporal.NewNonRetryableApplicationError("publish rejected: conflicts with the head", activities.ErrDaemon, nil,
		map[string]any{"kind": "operation_failed", "message": "publish rejected", "details": mergeDetails(det, in)})
}

func mergeDetails(det map[string]any, in PublishInput) map[string]any {
	if det == nil {
		det = map[string]any{}
	}
	det["stage"], det["session_retained"], det["txid"] = "publish", true, in.TxID
	return det
}

func hostQueue(q string) string {
	if q == "" {
		return TaskQueue
	}
	return q
}
