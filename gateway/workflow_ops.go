package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/api/serviceerror"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// statusQuery maps list_workflows' status names to visibility's.
var statusQuery = map[string]string{"running": "Running", "completed": "Completed", "failed": "Failed", "canceled": "Canceled",
	"terminated": "Terminated", "continued_as_new": "ContinuedAsNew", "timed_out": "TimedOut"}

func (b *TemporalBackend) listWorkflowsOp(ctx context.Context, _ string, args map[string]any, _ bool, _ func(string)) (any, error) {
	var where []string
	if id, _ := args["sandbox_id"].(string); id != "" {
		where = append(where, sandboxQuery(id))
	}
	if st, _ := args["status"].(string); st != "" {
		where = append(where, fmt.Sprintf("ExecutionStatus = '%s'", statusQuery[st]))
	}
	limit := 100
	if n, ok := api.IntArg(args, "limit"); ok && n > 0 {
		limit = int(n)
	}
	out, err := b.listWorkflows(ctx, strings.Join(where, " AND "), limit)
	if err != nil {
		return nil, mapErr("", err)
	}
	if id, _ := args["sandbox_id"].(string); id != "" {
		b.freshLastPublish(ctx, id, out)
	}
	return map[string]any{"workflows": out}, nil
}

func (b *TemporalBackend) describeWorkflow(ctx context.Context, _ string, args map[string]any, _ bool, _ func(string)) (any, error) {
	id, _ := args["workflow_id"].(string)
	run, _ := args["run_id"].(string)
	d, err := b.Client.DescribeWorkflowExecution(ctx, id, run)
	if err != nil {
		return nil, workflowErr(id, err)
	}
	info := d.GetWorkflowExecutionInfo()
	out := map[string]any{"workflow_id": id, "run_id": info.GetExecution().GetRunId(), "type": info.GetType().GetName(),
		"status": statusName(info.GetStatus()), "start_time": info.GetStartTime().AsTime(), "history_length": info.GetHistoryLength(),
		"task_queue": info.GetTaskQueue(), "memo": decodeMemo(info.GetMemo().GetFields())}
	if ct := info.GetCloseTime(); ct != nil {
		out["close_time"] = ct.AsTime()
	}
	acts := []map[string]any{}
	for _, a := range d.GetPendingActivities() {
		pa := map[string]any{"activity": a.GetActivityType().GetName(), "state": strings.ToLower(strings.TrimPrefix(a.GetState().String(), "PENDING_ACTIVITY_STATE_")),
			"attempt": a.GetAttempt()}
		if f := a.GetLastFailure(); f != nil {
			pa["last_failure"] = f.GetMessage()
		}
		acts = append(acts, pa)
	}
	children := []map[string]any{}
	for _, c := range d.GetPendingChildren() {
		children = append(children, map[string]any{"workflow_id": c.GetWorkflowId(), "type": c.GetWorkflowTypeName()})
	}
	out["pending_activities"], out["pending_children"] = acts, children
	if u := b.uiURL(id, info.GetExecution().GetRunId()); u != "" {
		out["ui_url"] = u
	}
	return out, nil
}

func (b *TemporalBackend) waitOperation(ctx context.Context, _ string, args map[string]any, _ bool, _ func(string)) (any, error) {
	id, _ := args["workflow_id"].(string)
	update, _ := args["update_id"].(string)
	timeout := 10 * time.Minute
	if n, ok := api.IntArg(args, "timeout_ms"); ok && n > 0 {
		timeout = time.Duration(n) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var raw json.RawMessage
	var err error
	sandboxID := strings.TrimPrefix(id, "sandbox/")
	switch {
	case update != "":
		err = lifecycle.WaitUpdate(ctx, b.Client, b.Namespace, id, update, &raw)
		if errors.Is(err, lifecycle.ErrUpdateNotFound) {
			return nil, api.Errorf(api.KindNotFound, map[string]any{"workflow_id": id, "update_id": update},
				"workflow %s has no update %s (its current run and the runs it continued from were asked)", id, update)
		}
	case strings.HasPrefix(id, "sandbox/"):
		// An async create_sandbox: the sandbox's record once it is ready.
		var st workflows.SandboxState
		if err = b.update(ctx, sandboxID, workflows.UpdateWaitReady, &st); err == nil {
			rec := b.record(ctx, &st)
			if raw, err = json.Marshal(rec); err != nil {
				return nil, api.Errorf(api.KindInternal, nil, "encode record: %v", err)
			}
		}
	default:
		err = b.Client.GetWorkflow(ctx, id, "").Get(ctx, &raw)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workflow_id": id, "update_id": update},
				"%s is still running after %s; wait again", id, timeout)
		}
		return nil, workflowErr(id, err)
	}
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	return map[string]any{"workflow_id": id, "update_id": update, "status": "completed", "result": raw}, nil
}

func (b *TemporalBackend) cancelOperation(ctx context.Context, _ string, args map[string]any, _ bool, _ func(string)) (any, error) {
	id, _ := args["workflow_id"].(string)
	if strings.HasPrefix(id, "sandbox/") {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"workflow_id": id},
			"%s is a sandbox's own workflow: use destroy_sandbox (cancelling it would leave its container behind)", id)
	}
	if err := b.Client.CancelWorkflow(ctx, id, ""); err != nil {
		return nil, workflowErr(id, err)
	}
	return map[string]any{"workflow_id": id, "cancel_requested": true}, nil
}

// workflowErr: an unknown workflow is not_found; the rest as mapErr.
func workflowErr(id string, err error) error {
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return api.Errorf(api.KindNotFound, map[string]any{"workflow_id": id}, "workflow not found: %s", id)
	}
	return mapErr("", err)
}
