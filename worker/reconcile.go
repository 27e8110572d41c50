package worker

import (
	"context"
	"fmt"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// ReconcileReport says what a reconcile pass did.
type ReconcileReport struct {
	Removed []activities.Leftover `json:"removed"`
	Lost    []string              `json:"lost_sandboxes"`
}

// Reconcile runs at worker start. Docker objects with our labels whose
// sandbox workflow is not running are removed; running sandbox workflows
// whose container vanished are told so (they fail and clean up).
func (s *Service) Reconcile(ctx context.Context, acts *activities.Activities) (*ReconcileReport, error) {
	rep := &ReconcileReport{}
	running := func(sandboxID string) bool {
		d, err := s.Client.DescribeWorkflowExecution(ctx, workflows.SandboxWorkflowID(sandboxID), "")
		if err != nil {
			var nf *serviceerror.NotFound
			if ok := asNotFound(err, &nf); ok {
				return false
			}
			return true // unsure: keep
		}
		return d.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	}
	removed, err := acts.RemoveLeftovers(ctx, running)
	if err != nil {
		return rep, fmt.Errorf("remove leftovers: %w", err)
	}
	rep.Removed = removed

	var token []byte
	for {
		resp, err := s.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: s.Namespace, NextPageToken: token,
			Query: fmt.Sprintf("WorkflowType = '%s' AND ExecutionStatus = 'Running'", workflows.SandboxWorkflowName),
		})
		if err != nil {
			return rep, fmt.Errorf("list sandbox workflows: %w", err)
		}
		for _, e := range resp.GetExecutions() {
			id := strings.TrimPrefix(e.GetExecution().GetWorkflowId(), "sandbox/")
			if r, err := acts.Inspect(ctx, id); err == nil && !r.Exists && s.phase(ctx, id) == workflows.PhaseReady {
				if err := s.Client.SignalWorkflow(ctx, workflows.SandboxWorkflowID(id), "", workflows.SignalContainerLost, "its container no longer exists"); err == nil {
					rep.Lost = append(rep.Lost, id)
				}
			}
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	return rep, nil
}

func (s *Service) phase(ctx context.Context, sandboxID string) string {
	v, err := s.Client.QueryWorkflow(ctx, workflows.SandboxWorkflowID(sandboxID), "", workflows.QueryState)
	if err != nil {
		return ""
	}
	var st workflows.SandboxState
	if v.Get(&st) != nil {
		return ""
	}
	return st.Phase
}

func asNotFound(err error, target **serviceerror.NotFound) bool {
	nf, ok := err.(*serviceerror.NotFound)
	if ok {
		*target = nf
	}
	return ok
}
