package gateway

import (
	"context"
	"errors"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/imageref"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// orphans are the sandboxes with Docker objects on a host whose sandbox
// workflow this deployment does not run: on the named host, else on every
// live host of the cluster and this gateway's own workers. Queue says
// where each was found.
func (b *TemporalBackend) orphans(ctx context.Context, host string) ([]orphanObjects, error) {
	queues, err := b.orphanQueues(ctx, host)
	if err != nil {
		return nil, err
	}
	var orphans []orphanObjects
	for _, q := range queues {
		out, err := b.runHostOp(ctx, workflows.HostOp{Op: workflows.HostOpSandboxes, Queue: q.queue})
		if err != nil {
			return nil, err
		}
		for _, o := range out.Sandboxes {
			live, memo, err := b.live(ctx, o.SandboxID)
			if err != nil {
				return nil, err
			}
			// A sandbox made from a standby has no workspace-root label,
			// and one made from a spare no image label on its volume
			// (their labels predate the claim): its last workflow's memo
			// names them.
			if o.WorkspaceRoot == "" {
				o.WorkspaceRoot, _ = memo["workspace_root"].(string)
			}
			if o.Image == "" {
				o.Image, _ = memo["image"].(string)
			}
			if !live {
				orphans = append(orphans, orphanObjects{SandboxObjects: o, Host: q.name, Queue: q.queue})
			}
		}
	}
	return orphans, nil
}

// orphanObjects is an orphan and the host it was found on.
type orphanObjects struct {
	workflows.SandboxObjects
	Host, Queue string
}

type hostQueue struct{ name, queue string }

// orphanQueues are the host queues an orphan operation asks: the named
// host's, else every live registered host's and the gateway's own (or the
// default host queue when no host registered).
func (b *TemporalBackend) orphanQueues(ctx context.Context, host string) ([]hostQueue, error) {
	if host != "" {
		q, err := b.place(ctx, host, false)
		if err != nil {
			return nil, err
		}
		return []hostQueue{{host, q}}, nil
	}
	var out []hostQueue
	seen := map[string]bool{}
	if b.LocalQueue != "" {
		out, seen[b.LocalQueue] = append(out, hostQueue{b.LocalName, b.LocalQueue}), true
	}
	hosts, err := b.hosts(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for _, h := range hosts {
		if h.Live(now) && !seen[h.Queue] {
			out, seen[h.Queue] = append(out, hostQueue{h.Name, h.Queue}), true
		}
	}
	if len(out) == 0 {
		out = append(out, hostQueue{"", b.HostQueue})
	}
	return out, nil
}

// live reports whether the sandbox's workflow runs in this deployment.
func (b *TemporalBackend) live(ctx context.Context, id string) (live bool, memo map[string]any, err error) {
	d, err := b.Client.DescribeWorkflowExecution(ctx, workflows.SandboxWorkflowID(id), "")
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, mapErr(id, err)
	}
	info := d.GetWorkflowExecutionInfo()
	return info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, decodeMemo(info.GetMemo().GetFields()), nil
}

func (b *TemporalBackend) listOrphans(ctx context.Context, _ string, args map[string]any, _ bool, _ func(string)) (any, error) {
	host, _ := args["host"].(string)
	orphans, err := b.orphans(ctx, host)
	if err != nil {
		return nil, err
	}
	cluster := b.clusterID(ctx)
	ns := b.namespace()
	list := make([]map[string]any, 0, len(orphans))
	for _, o := range orphans {
		list = append(list, map[string]any{"sandbox_id": o.SandboxID, "container": o.Container, "container_state": o.ContainerState,
			"volume": o.Volume, "volume_bytes": o.VolumeBytes, "created": o.Created, "age_s": int64(time.Since(o.Created).Seconds()),
			"image": o.Image, "workspace_root": o.WorkspaceRoot, "temporal_cluster": o.Cluster, "temporal_namespace": o.Namespace,
			"owned_by_this_deployment": o.Cluster == "" || (o.Cluster == cluster && o.Namespace == ns), "host": o.Host})
	}
	return map[string]any{"orphans": list}, nil
}

// orphan finds one orphan, refusing a sandbox that is live or unknown.
func (b *TemporalBackend) orphan(ctx context.Context, id, host string) (*orphanObjects, error) {
	if id == "" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "sandbox_id"}, "sandbox_id is required")
	}
	live, _, err := b.live(ctx, id)
	if err != nil {
		return nil, err
	}
	if live {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"sandbox_id": id},
			"sandbox %s is not an orphan: its workflow runs (use destroy_sandbox)", id)
	}
	orphans, err := b.orphans(ctx, host)
	if err != nil {
		return nil, err
	}
	for i := range orphans {
		if orphans[i].SandboxID == id {
			return &orphans[i], nil
		}
	}
	return nil, api.Errorf(api.KindNotFound, map[string]any{"sandbox_id": id}, "no orphaned sandbox %s on any host asked (list_orphaned_sandboxes)", id)
}

func (b *TemporalBackend) adoptOrphan(ctx context.Context, _ string, args map[string]any, _ bool, progress func(string)) (any, error) {
	id, _ := args["sandbox_id"].(string)
	host, _ := args["host"].(string)
	o, err := b.orphan(ctx, id, host)
	if err != nil {
		return nil, err
	}
	if o.Volume == "" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"sandbox_id": id}, "orphan %s has no state volume: nothing to adopt (delete_orphaned_sandbox)", id)
	}
	image, _ := args["image"].(string)
	if image == "" {
		image = o.Image
	}
	if err := imageref.Check(image); err != nil {
		return nil, err
	}
	spec := workflows.SandboxSpec{SandboxID: id, Image: image, WorkspaceRoot: o.WorkspaceRoot}
	memo := map[string]any{"workspace_root": o.WorkspaceRoot, "image": image, "request_id": RequestID(ctx), "adopted": true}
	states, err := lifecycle.CreateSandboxes(ctx, b.Client, spec, []string{id}, lifecycle.CreateOptions{HostQueue: o.Queue, Memo: memo,
		Progress: progress, Adopt: true})
	if err != nil {
		return nil, mapErr(id, err)
	}
	b.rememberContainer(id, states[0].Container)
	return b.recordWith(states[0], memo), nil
}

func (b *TemporalBackend) deleteOrphan(ctx context.Context, _ string, args map[string]any, _ bool, _ func(string)) (any, error) {
	id, _ := args["sandbox_id"].(string)
	if ok, _ := args["confirm"].(bool); !ok {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "confirm"}, "delete_orphaned_sandbox deletes the orphan's work: pass confirm true")
	}
	host, _ := args["host"].(string)
	o, err := b.orphan(ctx, id, host)
	if err != nil {
		return nil, err
	}
	if _, err := b.runHostOp(ctx, workflows.HostOp{Op: workflows.HostOpRemove, SandboxIDs: []string{id}, Queue: o.Queue}); err != nil {
		return nil, err
	}
	return map[string]any{"sandbox_id": id, "deleted": true}, nil
}

// clusterID is the Temporal cluster's id, as the workers label objects.
func (b *TemporalBackend) clusterID(ctx context.Context) string {
	info, err := b.Client.WorkflowService().GetClusterInfo(ctx, &workflowservice.GetClusterInfoRequest{})
	if err != nil {
		return ""
	}
	return info.GetClusterId()
}
