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
	// Orphans are sandboxes of this deployment whose workflow is gone:
	// their containers are stopped, their volumes kept, until a user adopts
	// (adopt_orphaned_sandbox) or deletes (delete_orphaned_sandbox) them.
	Orphans []workflows.SandboxObjects `json:"orphans"`
	// Foreign are sandboxes another Temporal cluster or namespace made:
	// left exactly as they are.
	Foreign []workflows.SandboxObjects `json:"foreign"`
	Lost    []string                   `json:"lost_sandboxes"`
}

// Reconcile runs at worker start. It never deletes anything: a sandbox
// whose workflow this deployment no longer runs is an orphan — its
// container is stopped and it is listed, its state volume (published and
// unpublished work) kept —, and a sandbox made by another deployment (other
// cluster id or namespace, as its labels say) is not touched at all.
// Running sandbox workflows whose container vanished are told so.
func (s *Service) Reconcile(ctx context.Context, acts *activities.Activities) (*ReconcileReport, error) {
	rep := &ReconcileReport{}
	objs, err := acts.ListSandboxObjects(ctx)
	if err != nil {
		return rep, fmt.Errorf("list sandbox objects: %w", err)
	}
	for _, o := range objs {
		if !activities.Owns(acts, o) {
			rep.Foreign = append(rep.Foreign, o)
			continue
		}
		if s.running(ctx, o.SandboxID) {
			continue
		}
		if o.ContainerState == "running" || o.ContainerState == "restarting" {
			if err := acts.StopContainer(ctx, o.SandboxID); err != nil {
				s.log.Warn("stop orphaned sandbox", "sandbox_id", o.SandboxID, "err", err)
			}
		}
		s.log.Warn("orphaned sandbox kept: adopt_orphaned_sandbox or delete_orphaned_sandbox", "sandbox_id", o.SandboxID,
			"volume", o.Volume, "volume_bytes", o.VolumeBytes)
		rep.Orphans = append(rep.Orphans, o)
	}

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
			// Only this host's sandboxes: in a cluster, another host's
			// container is never on this host's Engine.
			if r, err := acts.Inspect(ctx, id); err == nil && !r.Exists && s.readyHere(ctx, id) {
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

// running reports whether this deployment runs the sandbox's workflow;
// when Temporal cannot say, it counts as running (nothing is done to it).
func (s *Service) running(ctx context.Context, sandboxID string) bool {
	d, err := s.Client.DescribeWorkflowExecution(ctx, workflows.SandboxWorkflowID(sandboxID), "")
	if err != nil {
		var nf *serviceerror.NotFound
		return !asNotFound(err, &nf)
	}
	return d.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
}

// readyHere reports whether the sandbox is ready and runs on this host
// (its host queue is this worker's, or the shared one of a single-host
// deployment).
func (s *Service) readyHere(ctx context.Context, sandboxID string) bool {
	v, err := s.Client.QueryWorkflow(ctx, workflows.SandboxWorkflowID(sandboxID), "", workflows.QueryState)
	if err != nil {
		return false
	}
	var st workflows.SandboxState
	if v.Get(&st) != nil {
		return false
	}
	return st.Phase == workflows.PhaseReady && (st.HostQueue == "" || st.HostQueue == workflows.TaskQueue || st.HostQueue == s.HostQueue)
}

func asNotFound(err error, target **serviceerror.NotFound) bool {
	nf, ok := err.(*serviceerror.NotFound)
	if ok {
		*target = nf
	}
	return ok
}
