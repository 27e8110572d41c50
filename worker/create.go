package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// CreateSandboxes starts one sandbox workflow per id and waits until each
// is ready. With more than one id the sandboxes share one base: the first
// (the leader) imports the workspace into a shared base volume, the others
// mount it read-only and start from the leader's base id — one import, one
// copy of the base on disk, whatever the count.
func (s *Service) CreateSandboxes(ctx context.Context, spec activities.SandboxSpec, ids []string, sessionTTL time.Duration) ([]*workflows.SandboxState, error) {
	if len(ids) == 0 {
		return nil, errors.New("create sandboxes: no ids")
	}
	leader := spec
	leader.SandboxID = ids[0]
	if len(ids) > 1 {
		leader.SharedBase = &activities.SharedBase{Volume: activities.BaseVolumeName(ids[0]), Leader: true}
	}
	first, err := s.createOne(ctx, workflows.SandboxInput{Spec: leader, HostQueue: s.HostQueue, SessionTTL: sessionTTL})
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
		f.SharedBase = &activities.SharedBase{Volume: leader.SharedBase.Volume}
		wg.Add(1)
		go func(i int, in workflows.SandboxInput) {
			defer wg.Done()
			out[i], errs[i] = s.createOne(ctx, in)
		}(i, workflows.SandboxInput{Spec: f, HostQueue: s.HostQueue, SessionTTL: sessionTTL, BaseID: first.BaseID})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

func (s *Service) createOne(ctx context.Context, in workflows.SandboxInput) (*workflows.SandboxState, error) {
	_, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(in.Spec.SandboxID),
		TaskQueue: workflows.TaskQueue}, workflows.SandboxWorkflowName, in)
	if err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", in.Spec.SandboxID, err)
	}
	h, err := s.Client.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: workflows.SandboxWorkflowID(in.Spec.SandboxID),
		UpdateName: workflows.UpdateWaitReady, WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", in.Spec.SandboxID, err)
	}
	var st workflows.SandboxState
	if err := h.Get(ctx, &st); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", in.Spec.SandboxID, err)
	}
	return &st, nil
}
