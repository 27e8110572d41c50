package gateway

import (
	"context"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	tclient "go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// hostOpTimeout bounds a read of a Docker host: a host without a
// running worker answers nothing, and the caller is told so.
const hostOpTimeout = 30 * time.Second

// healthHostTimeout is how long /healthz waits for the host's worker.
const healthHostTimeout = 3 * time.Second

// runHostOp runs one HostOpWorkflow on the host's worker and waits for it.
func (b *TemporalBackend) runHostOp(ctx context.Context, r workflows.HostOp) (*workflows.HostOpResult, error) {
	if r.Queue == "" {
		r.Queue = b.HostQueue
	}
	timeout := hostOpTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	id := RequestID(ctx)
	if id == "" {
		id = client.NewRequestID()
	}
	run, err := b.Client.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{ID: "host/" + r.Op + "/" + id, TaskQueue: workflows.TaskQueue,
		WorkflowExecutionTimeout: hostOpTimeout,
		// A retried request joins the run of its first attempt.
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING}, workflows.HostOpWorkflowName, r)
	if err != nil {
		return nil, mapErr("", err)
	}
	var out workflows.HostOpResult
	if err := run.Get(ctx, &out); err != nil {
		if ctx.Err() != nil {
			return nil, api.Errorf(api.KindOperationFailed, map[string]any{"host_queue": r.Queue},
				"no worker of the sandbox host answered within %s (is sandbox-worker running for this host?)", timeout.Round(time.Millisecond))
		}
		return nil, mapErr("", err)
	}
	return &out, nil
}

// hostRead serves the catalog's RouteHost ops.
func (b *TemporalBackend) hostOp(ctx context.Context, op string, args map[string]any) (any, error) {
	// The read runs on the named host (args host), else where a new
	// sandbox would go.
	name, _ := args["host"].(string)
	queue, err := b.place(ctx, name, false)
	if err != nil {
		return nil, err
	}
	switch op {
	case "list_docker_images":
		out, err := b.runHostOp(ctx, workflows.HostOp{Op: workflows.HostOpImages, Queue: queue})
		if err != nil {
			return nil, err
		}
		if out.Images == nil {
			out.Images = []workflows.ImageInfo{}
		}
		return map[string]any{"images": out.Images}, nil
	case "list_workspace_directories":
		p, _ := args["path"].(string)
		out, err := b.runHostOp(ctx, workflows.HostOp{Op: workflows.HostOpDirectories, Path: p, Queue: queue})
		if err != nil {
			return nil, err
		}
		return out.Directories, nil
	}
	return nil, api.Errorf(api.KindInternal, map[string]any{"op": op}, "no host read for %s", op)
}
