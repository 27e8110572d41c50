package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// CreateOptions tune CreateSandboxes.
type CreateOptions struct {
	HostQueue  string
	SessionTTL time.Duration
	// SandboxTTL pauses each sandbox this long after creation or resume.
	SandboxTTL time.Duration
	Memo       map[string]any
	Progress   func(msg string) // nil: no progress
	// Adopt recreates the workflows of orphaned sandboxes over their
	// existing volumes (ids are theirs; one id).
	Adopt bool
}

// CreateSandboxes starts one sandbox workflow per id and waits until each
// is ready. With more than one id the sandboxes share one base: the first
// (the leader) imports the workspace into a shared base volume, the others
// mount it read-only and start from the leader's base id — one import, one
// copy of the base on disk, whatever the count.
func CreateSandboxes(ctx context.Context, c client.Client, spec workflows.SandboxSpec, ids []string, o CreateOptions) ([]*workflows.SandboxState, error) {
	if len(ids) == 0 {
		return nil, errors.New("create sandboxes: no ids")
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	leader := spec
	leader.SandboxID = ids[0]
	if len(ids) > 1 {
		leader.SharedBase = &workflows.SharedBase{Volume: workflows.BaseVolumeName(ids[0]), Leader: true}
	}
	first, err := createOne(ctx, c, workflows.SandboxInput{Spec: leader, HostQueue: o.HostQueue, SessionTTL: o.SessionTTL, SandboxTTL: o.SandboxTTL, Adopt: o.Adopt}, o)
	if err != nil {
		return nil, err
	}
	out := make([]*workflows.SandboxState, len(ids))
	out[0] = first
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i := 1; i < len(ids); i++ {
		f := spec
		f.SandboxID = ids[i]
		f.SharedBase = &workflows.SharedBase{Volume: leader.SharedBase.Volume}
		wg.Add(1)
		go func(i int, in workflows.SandboxInput) {
			defer wg.Done()
			out[i], errs[i] = createOne(ctx, c, in, o)
		}(i, workflows.SandboxInput{Spec: f, HostQueue: o.HostQueue, SessionTTL: o.SessionTTL, SandboxTTL: o.SandboxTTL, BaseID: first.BaseID})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Start starts a sandbox workflow without waiting (create_sandbox async).
func Start(ctx context.Context, c client.Client, in workflows.SandboxInput, memo map[string]any) (string, error) {
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(in.Spec.SandboxID),
		TaskQueue: workflows.TaskQueue, Memo: memo}, workflows.SandboxWorkflowName, in)
	if err != nil {
		return "", fmt.Errorf("start sandbox %s: %w", in.Spec.SandboxID, err)
	}
	return run.GetID(), nil
}

func createOne(ctx context.Context, c client.Client, in workflows.SandboxInput, o CreateOptions) (*workflows.SandboxState, error) {
	id := in.Spec.SandboxID
	o.Progress("creating sandbox " + id)
	if _, err := Start(ctx, c, in, o.Memo); err != nil {
		return nil, err
	}
	o.Progress("waiting for sandbox " + id + " to be ready")
	var st workflows.SandboxState
	if err := Update(ctx, c, id, workflows.UpdateWaitReady, "", &st); err != nil {
		o.Progress("sandbox " + id + " failed: " + err.Error())
		return nil, err
	}
	o.Progress("sandbox " + id + " ready")
	return &st, nil
}

// Update runs one SandboxWorkflow update and waits for its result.
func Update(ctx context.Context, c client.Client, sandboxID, name, updateID string, out any, args ...any) error {
	h, err := Send(ctx, c, client.UpdateWorkflowOptions{WorkflowID: workflows.SandboxWorkflowID(sandboxID),
		UpdateID: updateID, UpdateName: name, Args: args, WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		return err
	}
	return h.Get(ctx, out)
}

// WaitUpdate waits for the result of update updateID of workflow
// workflowID (in namespace, "" = default), in the run that has it: the
// current one or one it continued from (a sandbox's workflow continues as
// new, so the update of an async operation may be in an earlier run by the
// time its result is asked for). An update no run of the last maxRunsBack
// has is ErrUpdateNotFound.
func WaitUpdate(ctx context.Context, c client.Client, namespace, workflowID, updateID string, out any) error {
	if namespace == "" {
		namespace = "default"
	}
	run := ""
	for i := 0; i < maxRunsBack; i++ {
		err := c.GetWorkflowUpdateHandle(client.GetWorkflowUpdateHandleOptions{WorkflowID: workflowID, RunID: run, UpdateID: updateID}).Get(ctx, out)
		var nf *serviceerror.NotFound
		if !errors.As(err, &nf) {
			return err
		}
		prev, perr := previousRun(ctx, c, namespace, workflowID, run)
		if perr != nil {
			if errors.As(perr, &nf) && run == "" {
				return perr // no such workflow
			}
			return ErrUpdateNotFound
		}
		if prev == "" {
			return ErrUpdateNotFound
		}
		run = prev
	}
	return ErrUpdateNotFound
}

// ErrUpdateNotFound: WaitUpdate found the workflow but no run of it has
// the update.
var ErrUpdateNotFound = errors.New("no run of the workflow has this update")

// maxRunsBack bounds WaitUpdate's walk: at least 5,000 updates back, and
// for an update id nobody sent 50 polls and 50 one-event history reads.
const maxRunsBack = 50

// previousRun is the run that run ("" = the current one) of workflowID
// continued from, "" if none: the first event of its history, read alone.
func previousRun(ctx context.Context, c client.Client, namespace, workflowID, run string) (string, error) {
	resp, err := c.WorkflowService().GetWorkflowExecutionHistory(ctx, &workflowservice.GetWorkflowExecutionHistoryRequest{Namespace: namespace,
		Execution: &commonpb.WorkflowExecution{WorkflowId: workflowID, RunId: run}, MaximumPageSize: 1})
	if err != nil {
		return "", err
	}
	evs := resp.GetHistory().GetEvents()
	if len(evs) == 0 {
		return "", nil
	}
	return evs[0].GetWorkflowExecutionStartedEventAttributes().GetContinuedExecutionRunId(), nil
}

// Send sends one update to a sandbox's workflow and returns its handle
// once the update reached o.WaitForStage. An update the workflow refused
// because it is between two runs (workflows.KindContinuing: a run about
// to continue as new refuses new updates, and the next run takes them a
// few milliseconds later) is sent again, so no caller sees the hand-over;
// any other refusal is the handle's answer.
func Send(ctx context.Context, c client.Client, o client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		h, err := c.UpdateWorkflow(ctx, o)
		if err != nil {
			return nil, err
		}
		if e, ok := apperr.From(Settled(ctx, h)); !ok || e.Kind != workflows.KindContinuing {
			return h, nil
		}
		select {
		case <-ctx.Done():
			return h, nil // its answer is the refusal
		case <-time.After(wait):
		}
	}
}

// Settled is the error an update's handle already holds: a refusal by the
// workflow's validator, or the failure of an update that completed before
// the call returned; nil while it runs or when it succeeded. It asks
// nothing of the server (a handle still waiting on its update only sees
// the context it is given ended).
func Settled(ctx context.Context, h client.WorkflowUpdateHandle) error {
	done, cancel := context.WithCancel(ctx)
	cancel()
	err := h.Get(done, nil)
	if _, ok := apperr.From(err); ok {
		return err
	}
	return nil
}

// Accepted is the answer to an async lifecycle operation: the update was
// accepted by the sandbox workflow and runs on; the Temporal UI (or a
// later call with the same request id) shows its outcome.
type Accepted struct {
	Status     string `json:"status"` // "accepted"
	WorkflowID string `json:"workflow_id"`
	UpdateID   string `json:"update_id"`
}

// UpdateAsync submits an update and returns once the workflow accepted
// it. An update the workflow's validator refused answers the refusal,
// never "accepted" (nothing of it is recorded: waiting for it later would
// find no such update); one that was accepted and already failed is
// accepted, its failure is what WaitUpdate answers.
func UpdateAsync(ctx context.Context, c client.Client, sandboxID, name, updateID string, args ...any) (*Accepted, error) {
	h, err := Send(ctx, c, client.UpdateWorkflowOptions{WorkflowID: workflows.SandboxWorkflowID(sandboxID),
		UpdateID: updateID, UpdateName: name, Args: args, WaitForStage: client.WorkflowUpdateStageAccepted})
	if err != nil {
		return nil, err
	}
	if err := Settled(ctx, h); err != nil {
		// Refused, or accepted and failed at once: only the run can tell.
		poll := c.GetWorkflowUpdateHandle(client.GetWorkflowUpdateHandleOptions{WorkflowID: h.WorkflowID(), RunID: h.RunID(), UpdateID: h.UpdateID()})
		var nf *serviceerror.NotFound
		if perr := poll.Get(ctx, nil); errors.As(perr, &nf) {
			return nil, err
		}
	}
	return &Accepted{Status: "accepted", WorkflowID: workflows.SandboxWorkflowID(sandboxID), UpdateID: h.UpdateID()}, nil
}
