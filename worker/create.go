package worker

import (
	"context"
	"time"

	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// CreateSandboxes creates sandboxes on this service's host queue (see
// lifecycle.CreateSandboxes: more than one id share one base).
func (s *Service) CreateSandboxes(ctx context.Context, spec workflows.SandboxSpec, ids []string, sessionTTL time.Duration) ([]*workflows.SandboxState, error) {
	return lifecycle.CreateSandboxes(ctx, s.Client, spec, ids, lifecycle.CreateOptions{HostQueue: s.HostQueue, SessionTTL: sessionTTL})
}
