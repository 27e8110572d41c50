package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// Fleet fan-out defaults (the seed's manager.observability_snapshot).
const (
	DefaultFleetConcurrency = 8
	DefaultFleetTimeout     = 1500 * time.Millisecond
)

// fleetEntry is one running sandbox workflow: its state (or why it could
// not be read) and its memo.
type fleetEntry struct {
	ID    string
	Memo  map[string]any
	State *workflows.SandboxState
	Err   error
}

// fleet lists the running sandbox workflows with their state, sorted by
// id; unclaimed standbys (standby.go) are no one's sandboxes yet and are
// left out.
func (b *TemporalBackend) fleet(ctx context.Context) ([]fleetEntry, error) {
	out, err := b.listSandboxWorkflows(ctx)
	if err != nil {
		return nil, err
	}
	b.each(ctx, out, func(ctx context.Context, f *fleetEntry) { f.State, _, f.Err = b.viewState(ctx, f.ID) })
	kept := out[:0]
	for _, f := range out {
		if standby, _ := f.Memo[workflows.MemoStandby].(bool); (f.State != nil && f.State.Standby) || (f.State == nil && standby) {
			continue
		}
		kept = append(kept, f)
	}
	out = kept
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// listSandboxWorkflows lists the running sandbox workflows with their memo
// (visibility only: no state is read).
func (b *TemporalBackend) listSandboxWorkflows(ctx context.Context) ([]fleetEntry, error) {
	q := fmt.Sprintf("WorkflowType = '%s' AND ExecutionStatus = 'Running'", workflows.SandboxWorkflowName)
	var out []fleetEntry
	var token []byte
	for {
		resp, err := b.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: q, NextPageToken: token})
		if err != nil {
			return nil, mapErr("", err)
		}
		for _, e := range resp.GetExecutions() {
			id := e.GetExecution().GetWorkflowId()
			if e.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING || len(id) <= len("sandbox/") {
				continue
			}
			f := fleetEntry{ID: id[len("sandbox/"):]}
			if e.GetMemo() != nil {
				f.Memo = decodeMemo(e.GetMemo().GetFields())
			}
			out = append(out, f)
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return out, nil
		}
	}
}

// each runs fn for every entry, at most FleetConcurrency at once, each with
// its own FleetTimeout, so one stuck sandbox cannot hold up the others.
func (b *TemporalBackend) each(ctx context.Context, fleet []fleetEntry, fn func(context.Context, *fleetEntry)) {
	n := b.FleetConcurrency
	if n <= 0 {
		n = DefaultFleetConcurrency
	}
	timeout := b.FleetTimeout
	if timeout <= 0 {
		timeout = DefaultFleetTimeout
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i := range fleet {
		wg.Add(1)
		sem <- struct{}{}
		go func(f *fleetEntry) {
			defer wg.Done()
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			fn(cctx, f)
		}(&fleet[i])
	}
	wg.Wait()
}

func unavailable(id, phase string, err error) map[string]any {
	e := api.AsError(err)
	return map[string]any{"sandbox_id": id, "lifecycle_state": phase, "availability": "unavailable",
		"sampled_at_unix_ms": time.Now().UnixMilli(), "errors": []any{map[string]any{"kind": e.Kind, "message": e.Message}}}
}

// fleetSnapshot is the system-scope snapshot: every sandbox's own snapshot,
// asked of its daemon with bounded concurrency and a per-sandbox timeout.
// A sandbox that is not ready, or whose daemon does not answer in time, is
// an unavailable node with its errors; the call itself still succeeds.
func (b *TemporalBackend) fleetSnapshot(ctx context.Context) (any, error) {
	fleet, err := b.fleet(ctx)
	if err != nil {
		return nil, err
	}
	nodes := make([]map[string]any, len(fleet))
	idx := map[string]int{}
	for i, f := range fleet {
		idx[f.ID] = i
	}
	b.each(ctx, fleet, func(ctx context.Context, f *fleetEntry) {
		i := idx[f.ID]
		if f.Err != nil {
			nodes[i] = unavailable(f.ID, "unknown", f.Err)
			return
		}
		if f.State.Phase != workflows.PhaseReady || f.State.Container.Daemon.Port == 0 {
			nodes[i] = unavailable(f.ID, f.State.Phase, api.Errorf("not_ready", nil, "sandbox %s is %s", f.ID, f.State.Phase))
			return
		}
		body, _ := json.Marshal(map[string]any{"sandbox_id": f.ID})
		raw, err := b.callDaemon(ctx, f.ID, f.State.Container.Daemon, "snapshot", body, nil)
		var node map[string]any
		if err == nil {
			err = json.Unmarshal(raw, &node)
		}
		if err != nil {
			if ctx.Err() != nil {
				err = api.Errorf("timeout", nil, "daemon of %s did not answer within the fan-out timeout", f.ID)
			}
			nodes[i] = unavailable(f.ID, f.State.Phase, err)
			return
		}
		node["sandbox_id"], node["lifecycle_state"] = f.ID, f.State.Phase
		nodes[i] = node
	})
	return map[string]any{"view": "snapshot", "scope": "system", "sandboxes": nodes}, nil
}

// fleetResources is the system-scope resources view: each sandbox's
// current container counters from the Docker Engine (one-shot stats, no
// sampling loop), or its daemon's latest sample when this gateway has no
// Docker access.
func (b *TemporalBackend) fleetResources(ctx context.Context) (any, error) {
	fleet, err := b.fleet(ctx)
	if err != nil {
		return nil, err
	}
	// Docker's counters, read on each host by its worker in one go; a
	// sandbox whose host is lost is unavailable without asking.
	byQueue := map[string][]string{}
	hostErr := map[string]error{}
	for _, f := range fleet {
		if f.Err == nil && f.State.Phase == workflows.PhaseReady {
			if err := b.checkHost(ctx, f.ID); err != nil {
				hostErr[f.ID] = err
				continue
			}
			q := f.State.HostQueue
			if b.isLocalQueue(q) {
				q = b.HostQueue
			}
			byQueue[q] = append(byQueue[q], f.ID)
		}
	}
	usage := &workflows.HostOpResult{Usage: map[string]workflows.ContainerUsage{}, UsageErrors: map[string]*api.Error{}}
	usageErr := map[string]error{}
	for q, ids := range byQueue {
		u, err := b.runHostOp(ctx, workflows.HostOp{Op: workflows.HostOpUsage, SandboxIDs: ids, Queue: q})
		for _, id := range ids {
			switch {
			case err != nil:
				usageErr[id] = err
			case u.UsageErrors[id] != nil:
				usage.UsageErrors[id] = u.UsageErrors[id]
			default:
				usage.Usage[id] = u.Usage[id]
			}
		}
	}
	out := map[string]any{}
	for _, f := range fleet {
		node := map[string]any{"availability": "available", "errors": []any{}, "current": nil}
		var err error
		switch {
		case f.Err != nil:
			err = f.Err
		case f.State.Phase != workflows.PhaseReady:
			err = api.Errorf("not_ready", nil, "sandbox %s is %s", f.ID, f.State.Phase)
		case hostErr[f.ID] != nil:
			err = hostErr[f.ID]
		case usageErr[f.ID] != nil:
			err = usageErr[f.ID]
		case usage.UsageErrors[f.ID] != nil:
			err = usage.UsageErrors[f.ID]
		default:
			node["current"], node["source"] = usage.Usage[f.ID], "docker_stats"
		}
		if err != nil {
			e := api.AsError(err)
			node["availability"], node["errors"] = "unavailable", []any{map[string]any{"kind": e.Kind, "message": e.Message}}
		}
		out[f.ID] = node
	}
	return map[string]any{"view": "resources", "scope": "system", "sandboxes": out}, nil
}
