package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/imageref"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// recordHandler serves a lifecycle op of RouteRecords.
type recordHandler func(b *TemporalBackend, ctx context.Context, sandboxID string, args map[string]any, async bool, progress func(string)) (any, error)

// recordHandlers are the gateway's own answers, by operation; every
// catalog op of RouteRecords has one (TestEveryRecordsOpHasAHandler).
var recordHandlers = map[string]recordHandler{
	"create_sandbox":          (*TemporalBackend).createSandboxes,
	"destroy_sandbox":         (*TemporalBackend).destroySandbox,
	"list_orphaned_sandboxes": (*TemporalBackend).listOrphans,
	"adopt_orphaned_sandbox":  (*TemporalBackend).adoptOrphan,
	"delete_orphaned_sandbox": (*TemporalBackend).deleteOrphan,
	"list_workflows":          (*TemporalBackend).listWorkflowsOp,
	"describe_workflow":       (*TemporalBackend).describeWorkflow,
	"wait_operation":          (*TemporalBackend).waitOperation,
	"cancel_operation":        (*TemporalBackend).cancelOperation,
	"inspect_sandbox": func(b *TemporalBackend, ctx context.Context, id string, _ map[string]any, _ bool, _ func(string)) (any, error) {
		st, memo, err := b.viewState(ctx, id)
		if err != nil {
			return nil, err
		}
		if st.Phase == workflows.PhaseStopped {
			// A destroyed sandbox is unknown everywhere, as in the seed (its
			// workflow history still answers the query).
			return nil, notFoundSandbox(id)
		}
		return b.recordWith(st, memo), nil
	},
	"list_sandboxes": func(b *TemporalBackend, ctx context.Context, _ string, _ map[string]any, _ bool, _ func(string)) (any, error) {
		return b.listSandboxes(ctx)
	},
	"workflows": func(b *TemporalBackend, ctx context.Context, id string, args map[string]any, _ bool, _ func(string)) (any, error) {
		limit := 100
		if n, ok := api.IntArg(args, "limit"); ok && n > 0 {
			limit = int(n)
		}
		return b.workflowsView(ctx, id, limit)
	},
}

// Lifecycle implements Backend.
func (b *TemporalBackend) Lifecycle(ctx context.Context, op, sandboxID string, args map[string]any) (any, error) {
	return b.LifecycleProgress(ctx, op, sandboxID, args, nil)
}

// LifecycleProgress implements ProgressBackend. How an op is served is the
// catalog's data (api.Operation.Route): a sandbox workflow update named
// like the op, a read of the Docker host, or one of the gateway's record
// handlers. With progress, the call reports what the workflow does.
func (b *TemporalBackend) LifecycleProgress(ctx context.Context, name, sandboxID string, args map[string]any, progress func(msg string)) (any, error) {
	op, ok := api.LookupOp(name)
	if !ok {
		return nil, api.Errorf(api.KindUnknownOp, map[string]any{"op": name}, "unknown operation %s", name)
	}
	async := isAsync(args)
	switch op.Route {
	case api.RouteRecords:
		if progress == nil {
			progress = func(string) {}
		}
		h, ok := recordHandlers[op.Name]
		if !ok {
			return nil, api.Errorf(api.KindInternal, map[string]any{"op": op.Name}, "no record handler for %s", op.Name)
		}
		return h(b, ctx, sandboxID, args, async, progress)
	case api.RouteHost:
		return b.hostOp(ctx, op.Name, args)
	}
	if op.Name == workflows.UpdatePause || op.Name == workflows.UpdateResume {
		// The daemon's endpoint changes (or goes): the next runtime call
		// asks the workflow.
		defer b.forget(sandboxID)
	}
	return b.updateOp(ctx, op, sandboxID, args, async, progress)
}

// updateOp runs an op as the sandbox workflow's update of the same name
// (a sessionless file op as its amend update). The op's arguments are the
// update's one request object; an op without arguments but its sandbox
// sends none.
func (b *TemporalBackend) updateOp(ctx context.Context, op *api.Operation, sandboxID string, args map[string]any, async bool, progress func(string)) (any, error) {
	delete(args, "sandbox_id")
	if op.Name == "export_changes" {
		// A destination outside the allowed roots is refused before any
		// work (the export activity checks again).
		dest, _ := args["dest"].(string)
		format, _ := args["format"].(string)
		if _, err := b.hostPaths().Dest("dest", dest, format == "" || strings.EqualFold(format, "dir") || format == "git"); err != nil {
			return nil, hostpath.Refusal(err)
		}
	}
	name, req := op.Name, any(args)
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "args: %v", err)
	}
	// Refused before it is sent: an update too large for the workflow's
	// history would fail its task and hold up the sandbox's other updates.
	if aerr := api.CheckUpdateArgsSize(op.Name, len(raw)); aerr != nil {
		return nil, aerr
	}
	if op.AmendWhenSessionless {
		name, req = workflows.UpdateAmend, workflows.AmendRequest{Op: op.Name, Args: raw}
	}
	var payload []any
	if req != nil && (op.AmendWhenSessionless || hasRequestArgs(op)) {
		payload = []any{req}
	}
	if async {
		return b.submit(ctx, sandboxID, name, payload...)
	}
	watching := op.Progress && progress != nil
	if watching {
		progress(startMessage(op.Name, sandboxID, args))
		session, _ := args["workspace_session_id"].(string)
		stop := b.watch(ctx, sandboxID, func(kind, n string) bool {
			if kind == "child" {
				return session != "" && strings.Contains(n, "/"+session+"/")
			}
			return n != "CallDaemon"
		}, progress)
		defer stop()
	}
	out, err := b.run(ctx, false, sandboxID, name, payload...)
	if watching {
		progress(endMessage(op.Name, out, err))
	}
	return out, err
}

// hasRequestArgs reports whether an op takes arguments besides its sandbox.
func hasRequestArgs(op *api.Operation) bool {
	for _, a := range op.Args {
		if a.Name != "sandbox_id" && a.Name != "async" {
			return true
		}
	}
	return false
}

func startMessage(op, sandboxID string, args map[string]any) string {
	switch op {
	case "publish_workspace_session":
		return fmt.Sprintf("publishing workspace session %v", args["workspace_session_id"])
	case "squash_layerstacks":
		return "squashing the layer stack of " + sandboxID
	case "export_changes":
		return fmt.Sprintf("exporting the published changes of %s to %v", sandboxID, args["dest"])
	}
	return op + " on " + sandboxID
}

func endMessage(op string, out any, err error) string {
	if op == "publish_workspace_session" {
		return publishOutcome(out, err)
	}
	verb := strings.SplitN(op, "_", 2)[0]
	if err != nil {
		return verb + " failed: " + api.AsError(err).Message
	}
	return verb + " done"
}

// publishOutcome is the last progress message of a publish.
func publishOutcome(out any, err error) string {
	if err != nil {
		ae := api.AsError(err)
		if cs, ok := ae.Details["conflicts"].([]any); ok {
			return fmt.Sprintf("publish rejected: %d conflicting path(s); nothing committed", len(cs))
		}
		return "publish failed: " + ae.Message
	}
	var res api.PublishFinalResult
	if raw, ok := out.(json.RawMessage); ok && json.Unmarshal(raw, &res) == nil && res.Publish != nil {
		if res.Publish.NoOp {
			return "published: nothing to commit"
		}
		return fmt.Sprintf("published: manifest version %d", res.Publish.Revision.ManifestVersion)
	}
	return "published"
}

func (b *TemporalBackend) destroySandbox(ctx context.Context, sandboxID string, _ map[string]any, async bool, _ func(string)) (any, error) {
	if async {
		b.forget(sandboxID)
		return b.submit(ctx, sandboxID, workflows.UpdateDestroy)
	}
	var st workflows.SandboxState
	if err := b.update(ctx, sandboxID, workflows.UpdateDestroy, &st); err != nil {
		return nil, err
	}
	b.forget(sandboxID)
	return b.record(ctx, &st), nil
}

// createSandboxes creates count sandboxes; more than one share one base
// (lifecycle.CreateSandboxes). With async the workflow is only started.
func (b *TemporalBackend) createSandboxes(ctx context.Context, _ string, args map[string]any, async bool, progress func(string)) (any, error) {
	image, _ := args["image"].(string)
	if err := imageref.Check(image); err != nil {
		return nil, err
	}
	root, _ := args["workspace_root"].(string)
	root, err := b.hostPaths().Workspace("workspace_root", root)
	if err != nil {
		return nil, hostpath.Refusal(err)
	}
	count := 1
	if n, ok := api.IntArg(args, "count"); ok {
		count = int(n)
	}
	ids := make([]string, count)
	for i := range ids {
		ids[i] = "eos-" + client.NewRequestID()
	}
	ttl, idle, err := b.lifecycleArgs(args)
	if err != nil {
		return nil, err
	}
	memo := map[string]any{"workspace_root": root, "image": image, "request_id": RequestID(ctx)}
	spec := workflows.SandboxSpec{Image: image, WorkspaceRoot: root}
	// Placement: every activity of the sandbox runs on its host's queue.
	hostName, _ := args["host"].(string)
	queue, err := b.place(ctx, hostName, true)
	if err != nil {
		return nil, err
	}
	if progress == nil {
		progress = func(string) {}
	}
	// A standby of the image on that host serves a plain create at the
	// cost of the import, else the host's spare at the cost of the
	// container and the import (standby.go); any create of the image
	// starts the next standby, and the next spare.
	key, spare := standbyKey{image: image, queue: queue}, standbyKey{queue: queue}
	defer b.refillStandby(spare)
	if !async && count == 1 {
		claim := workflows.ClaimRequest{Image: image, WorkspaceRoot: root, SandboxTTL: ttl, SessionTTL: idle, Memo: memo}
		st, ok, err := b.claimStandby(ctx, key, claim, progress)
		fromSpare := false
		if !ok {
			st, ok, err = b.claimStandby(ctx, spare, claim, progress)
			fromSpare = ok
		}
		if ok {
			if err == nil || !fromSpare { // the image is known to be on the host
				b.refillStandby(key)
			}
			if err != nil {
				return nil, mapErr("", err)
			}
			b.rememberContainer(st.SandboxID, st.Container)
			b.rememberQueue(st.SandboxID, st.HostQueue)
			return b.recordWith(st, map[string]any{"workspace_root": root, "image": image}), nil
		}
	}
	if async {
		if count != 1 {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "async"}, "async create_sandbox takes count 1 (a group waits for its leader's base)")
		}
		spec.SandboxID = ids[0]
		wid, err := lifecycle.Start(ctx, b.Client, workflows.SandboxInput{HostQueue: queue, Spec: spec, SandboxTTL: ttl, SessionTTL: idle}, memo)
		if err != nil {
			return nil, mapErr(ids[0], err)
		}
		b.refillStandby(key)
		return map[string]any{"id": ids[0], "state": workflows.PhaseCreating, "workflow_id": wid, "workspace_root": root, "image": image}, nil
	}
	states, err := lifecycle.CreateSandboxes(ctx, b.Client, spec, ids, lifecycle.CreateOptions{HostQueue: queue, Memo: memo, Progress: progress,
		SandboxTTL: ttl, SessionTTL: idle})
	if err != nil {
		return nil, mapErr(ids[0], err)
	}
	b.refillStandby(key)
	records := make([]any, len(states))
	for i, st := range states {
		b.rememberContainer(ids[i], st.Container)
		b.rememberQueue(ids[i], st.HostQueue)
		records[i] = b.recordWith(st, map[string]any{"workspace_root": root, "image": image})
	}
	if count == 1 {
		return records[0], nil
	}
	return map[string]any{"sandboxes": records}, nil
}
