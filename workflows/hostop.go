package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// HostOpWorkflow runs one read of a Docker host on that host's worker:
// its local images, its directories, its Engine's version, its sandbox
// containers' counters. It is short and has no side effects; its id is
// the caller's request id.
func HostOpWorkflow(ctx workflow.Context, r HostOp) (*HostOpResult, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:           hostQueue(r.Queue),
		StartToCloseTimeout: 20 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 2},
	})
	out := &HostOpResult{}
	switch r.Op {
	case HostOpImages:
		return out, workflow.ExecuteActivity(ctx, ActListImages).Get(ctx, &out.Images)
	case HostOpDirectories:
		out.Directories = &DirectoryListing{}
		return out, workflow.ExecuteActivity(ctx, ActListDirectories, r.Path).Get(ctx, out.Directories)
	case HostOpVersion:
		return out, workflow.ExecuteActivity(ctx, ActDockerVersion).Get(ctx, &out.Version)
	case HostOpSandboxes:
		return out, workflow.ExecuteActivity(ctx, ActListSandboxes).Get(ctx, &out.Sandboxes)
	case HostOpRemove:
		if len(r.SandboxIDs) != 1 {
			return nil, apperr.Newf(api.KindInvalidRequest, nil, "remove_sandbox takes one sandbox id")
		}
		return out, workflow.ExecuteActivity(ctx, ActRemoveSandbox, r.SandboxIDs[0]).Get(ctx, nil)
	case HostOpUsage:
		futures := make([]workflow.Future, len(r.SandboxIDs))
		for i, id := range r.SandboxIDs {
			futures[i] = workflow.ExecuteActivity(ctx, ActUsage, id)
		}
		out.Usage, out.UsageErrors = map[string]ContainerUsage{}, map[string]*api.Error{}
		for i, id := range r.SandboxIDs {
			var u ContainerUsage
			if err := futures[i].Get(ctx, &u); err != nil {
				out.UsageErrors[id] = apperr.Client(err)
				continue
			}
			out.Usage[id] = u
		}
		return out, nil
	}
	return nil, apperr.Newf(api.KindInvalidRequest, map[string]any{"op": r.Op}, "unknown host read %q", r.Op)
}
