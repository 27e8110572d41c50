package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	tclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TemporalBackend runs lifecycle ops as SandboxWorkflow updates and runtime
// ops as direct daemon RPCs (POST /rpc/<op> with the derived daemon token).
type TemporalBackend struct {
	Client    tclient.Client
	HostQueue string                 // the task queue of the worker owning new sandboxes ("" = workflows.TaskQueue)
	Secret    []byte                 // the deployment secret daemon tokens derive from
	Acts      *activities.Activities // for Docker-side reads (list_docker_images); may be nil
	HTTP      *http.Client           // daemon client; nil = a keep-alive default
	Timeout   time.Duration          // per lifecycle update (default 10 minutes)
	Namespace string                 // Temporal namespace, for UI links ("" = default)
	UIAddress string                 // Temporal UI host:port, for links ("" = no links)
	// HostPaths is the rule for workspace_root and export dests, checked
	// before a workflow starts (nil = hostpath.Default()). The activities
	// check again with their own.
	HostPaths *hostpath.Policy
	// FleetConcurrency and FleetTimeout bound the system-wide views'
	// fan-out to the sandboxes (defaults 8 and 1.5 s per sandbox).
	FleetConcurrency int
	FleetTimeout     time.Duration

	mu        sync.Mutex
	endpoints map[string]activities.Endpoint
}

func (b *TemporalBackend) httpClient() *http.Client {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.HTTP == nil {
		b.HTTP = &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second, DisableCompression: true}}
	}
	return b.HTTP
}

func notFoundSandbox(id string) *api.Error {
	return api.Errorf(api.KindInvalidRequest, map[string]any{"sandbox_id": id}, "sandbox not found: %s", id)
}

// mapErr converts Temporal and daemon failures into the error envelope.
func mapErr(sandboxID string, err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return notFoundSandbox(sandboxID)
	}
	if de, ok := activities.AsDaemonError(err); ok {
		d := de.Details
		if d == nil {
			d = map[string]any{}
		}
		return &api.Error{Kind: de.Kind, Message: de.Message, Details: d}
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		if app.HasDetails() {
			var m map[string]any
			if app.Details(&m) == nil {
				if k, _ := m["kind"].(string); k != "" {
					msg, _ := m["message"].(string)
					d, _ := m["details"].(map[string]any)
					if d == nil {
						d = map[string]any{}
					}
					return &api.Error{Kind: k, Message: msg, Details: d}
				}
			}
		}
		kind := api.KindOperationFailed
		switch app.Type() {
		case activities.ErrInvalidArgument, activities.ErrImageNotFound, "NotReady":
			kind = api.KindInvalidRequest
		case activities.ErrNotFound:
			kind = api.KindNotFound
		case activities.ErrConflict:
			kind = api.KindConflict
		case workflows.ErrOperationConflict:
			kind = api.KindOperationConflict
		}
		return api.Errorf(kind, map[string]any{"type": app.Type()}, "%s", app.Message())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return api.Errorf(api.KindOperationFailed, nil, "timed out: %v", err)
	}
	return api.Errorf(api.KindInternal, nil, "%v", err)
}

func (b *TemporalBackend) timeout() time.Duration {
	if b.Timeout > 0 {
		return b.Timeout
	}
	return 10 * time.Minute
}

// update runs one SandboxWorkflow update and waits for its result; the
// request id is the update id, so a retried request joins the first.
func (b *TemporalBackend) update(ctx context.Context, sandboxID, name string, out any, args ...any) error {
	if sandboxID == "" {
		return api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout())
	defer cancel()
	return mapErr(sandboxID, lifecycle.Update(ctx, b.Client, sandboxID, name, RequestID(ctx), out, args...))
}

// submit runs an update the async way: it returns once the workflow
// accepted it.
func (b *TemporalBackend) submit(ctx context.Context, sandboxID, name string, args ...any) (any, error) {
	if sandboxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	acc, err := lifecycle.UpdateAsync(ctx, b.Client, sandboxID, name, RequestID(ctx), args...)
	if err != nil {
		return nil, mapErr(sandboxID, err)
	}
	return acc, nil
}

// run is update, or submit when the call asked for async.
func (b *TemporalBackend) run(ctx context.Context, async bool, sandboxID, name string, args ...any) (any, error) {
	if async {
		return b.submit(ctx, sandboxID, name, args...)
	}
	var out json.RawMessage
	if err := b.update(ctx, sandboxID, name, &out, args...); err != nil {
		return nil, err
	}
	return out, nil
}

func isAsync(args map[string]any) bool {
	v, _ := args["async"].(bool)
	delete(args, "async")
	return v
}

func decodeArgs(args map[string]any, into any) error {
	raw, _ := json.Marshal(args)
	if err := json.Unmarshal(raw, into); err != nil {
		return api.Errorf(api.KindInvalidRequest, nil, "args: %v", err)
	}
	return nil
}

// Lifecycle implements Backend.
func (b *TemporalBackend) Lifecycle(ctx context.Context, op, sandboxID string, args map[string]any) (any, error) {
	return b.LifecycleProgress(ctx, op, sandboxID, args, nil)
}

// LifecycleProgress implements ProgressBackend: create_sandbox reports its
// stages (workflow start, waiting for readiness, ready) to progress.
func (b *TemporalBackend) LifecycleProgress(ctx context.Context, op, sandboxID string, args map[string]any, progress func(msg string)) (any, error) {
	// Watching the workflow costs a describe per poll: only for a caller
	// who asked for progress.
	watch := b.watch
	if progress == nil {
		progress = func(string) {}
		watch = func(context.Context, string, func(string, string) bool, func(string)) func() { return func() {} }
	}
	async := isAsync(args)
	switch op {
	case "create_sandbox":
		return b.createSandboxes(ctx, args, async, progress)
	case "destroy_sandbox":
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
	case "inspect_sandbox":
		st, err := b.state(ctx, sandboxID)
		if err != nil {
			return nil, err
		}
		return b.record(ctx, st), nil
	case "list_sandboxes":
		return b.listSandboxes(ctx)
	case "workflows":
		limit := 100
		if n, err := strconv.Atoi(fmt.Sprint(args["limit"])); err == nil && n > 0 {
			limit = n
		}
		return b.workflowsView(ctx, sandboxID, limit)
	case "list_docker_images":
		if b.Acts == nil {
			return nil, api.Errorf(api.KindOperationFailed, nil, "this gateway has no Docker access (--no-workers)")
		}
		imgs, err := b.Acts.ListImages(ctx)
		if err != nil {
			return nil, mapErr("", err)
		}
		return map[string]any{"images": imgs}, nil
	case "list_workspace_directories":
		p, _ := args["path"].(string)
		return listDirectories(b.hostPaths(), p)
	case "create_workspace_session":
		var r workflows.CreateSessionRequest
		if err := decodeArgs(args, &r); err != nil {
			return nil, err
		}
		return b.run(ctx, async, sandboxID, workflows.UpdateCreateSession, r)
	case "destroy_workspace_session", "refresh_workspace_session":
		var r workflows.SessionRequest
		if err := decodeArgs(args, &r); err != nil {
			return nil, err
		}
		name := workflows.UpdateDestroySession
		if op == "refresh_workspace_session" {
			name = workflows.UpdateRefresh
		}
		return b.run(ctx, async, sandboxID, name, r)
	case "publish_workspace_session":
		var r workflows.PublishRequest
		if err := decodeArgs(args, &r); err != nil {
			return nil, err
		}
		if async {
			return b.submit(ctx, sandboxID, workflows.UpdatePublish, r)
		}
		progress("publishing workspace session " + r.WorkspaceSessionID)
		stop := watch(ctx, sandboxID, func(kind, name string) bool {
			return kind == "child" && strings.Contains(name, "/"+r.WorkspaceSessionID+"/")
		}, progress)
		out, err := b.run(ctx, false, sandboxID, workflows.UpdatePublish, r)
		stop()
		progress(publishOutcome(out, err))
		return out, err
	case "file_write", "file_edit", "file_delete", "file_move":
		raw, _ := json.Marshal(args)
		var out json.RawMessage
		return out, b.update(ctx, sandboxID, workflows.UpdateAmend, &out, workflows.AmendRequest{Op: op, Args: raw})
	case "squash_layerstacks":
		if !async {
			progress("squashing the layer stack of " + sandboxID)
			defer progress("squash done")
		}
		return b.run(ctx, async, sandboxID, workflows.UpdateSquash)
	case "export_changes":
		var r workflows.ExportRequest
		if err := decodeArgs(args, &r); err != nil {
			return nil, err
		}
		isDir := r.Format == "" || strings.EqualFold(r.Format, "dir")
		if _, err := b.hostPaths().Dest("dest", r.Dest, isDir); err != nil {
			return nil, hostPathRefused(err)
		}
		if async {
			return b.submit(ctx, sandboxID, workflows.UpdateExport, r)
		}
		progress("exporting the published changes of " + sandboxID + " to " + r.Dest)
		stop := watch(ctx, sandboxID, func(kind, name string) bool { return kind == "activity" && name == "ExportChanges" }, progress)
		out, err := b.run(ctx, false, sandboxID, workflows.UpdateExport, r)
		stop()
		if err == nil {
			progress("export done")
		}
		return out, err
	}
	// Unreachable for catalog operations (TestEveryLifecycleOpHasAHandler).
	return nil, api.Errorf(api.KindInternal, map[string]any{"op": op}, "no lifecycle handler for %s", op)
}

func (b *TemporalBackend) hostPaths() *hostpath.Policy {
	if b.HostPaths == nil {
		return hostpath.Default()
	}
	return b.HostPaths
}

// hostPathRefused is a refused host path as invalid_request, naming the
// argument and the rule it broke.
func hostPathRefused(err error) error {
	var he *hostpath.Error
	if errors.As(err, &he) {
		return api.Errorf(api.KindInvalidRequest, map[string]any{"arg": he.Arg, "path": he.Path, "rule": he.Rule}, "%s", he.Error())
	}
	return api.Errorf(api.KindInvalidRequest, nil, "%v", err)
}

// LifecycleOps are the operations LifecycleProgress handles; a test keeps
// this list equal to the catalog's lifecycle operations.
var LifecycleOps = []string{
	"create_sandbox", "destroy_sandbox", "inspect_sandbox", "list_sandboxes", "workflows", "list_docker_images",
	"list_workspace_directories", "create_workspace_session", "destroy_workspace_session", "refresh_workspace_session",
	"publish_workspace_session", "file_write", "file_edit", "file_delete", "file_move", "squash_layerstacks", "export_changes",
}

// createSandboxes creates count sandboxes; more than one share one base
// (lifecycle.CreateSandboxes). With async the workflow is only started.
func (b *TemporalBackend) createSandboxes(ctx context.Context, args map[string]any, async bool, progress func(string)) (any, error) {
	image, _ := args["image"].(string)
	root, _ := args["workspace_root"].(string)
	root, err := b.hostPaths().Workspace("workspace_root", root)
	if err != nil {
		return nil, hostPathRefused(err)
	}
	count := 1
	if n, ok := args["count"]; ok {
		if v, err := strconv.Atoi(fmt.Sprint(n)); err == nil {
			count = v
		}
	}
	ids := make([]string, count)
	for i := range ids {
		ids[i] = "eos-" + client.NewRequestID()
	}
	memo := map[string]any{"workspace_root": root, "image": image, "request_id": RequestID(ctx)}
	spec := activities.SandboxSpec{Image: image, WorkspaceRoot: root}
	if async {
		if count != 1 {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "async"}, "async create_sandbox takes count 1 (a group waits for its leader's base)")
		}
		spec.SandboxID = ids[0]
		wid, err := lifecycle.Start(ctx, b.Client, workflows.SandboxInput{HostQueue: b.HostQueue, Spec: spec}, memo)
		if err != nil {
			return nil, mapErr(ids[0], err)
		}
		return map[string]any{"id": ids[0], "state": workflows.PhaseCreating, "workflow_id": wid, "workspace_root": root, "image": image}, nil
	}
	states, err := lifecycle.CreateSandboxes(ctx, b.Client, spec, ids, lifecycle.CreateOptions{HostQueue: b.HostQueue, Memo: memo, Progress: progress})
	if err != nil {
		return nil, mapErr(ids[0], err)
	}
	records := make([]any, len(states))
	for i, st := range states {
		b.remember(ids[i], st.Container.Daemon)
		records[i] = b.recordWith(st, map[string]any{"workspace_root": root, "image": image})
	}
	if count == 1 {
		return records[0], nil
	}
	return map[string]any{"sandboxes": records}, nil
}

func (b *TemporalBackend) state(ctx context.Context, sandboxID string) (*workflows.SandboxState, error) {
	if sandboxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	v, err := b.Client.QueryWorkflow(ctx, workflows.SandboxWorkflowID(sandboxID), "", workflows.QueryState)
	if err != nil {
		return nil, mapErr(sandboxID, err)
	}
	var st workflows.SandboxState
	if err := v.Get(&st); err != nil {
		return nil, api.Errorf(api.KindInternal, nil, "decode state: %v", err)
	}
	return &st, nil
}

func (b *TemporalBackend) memo(ctx context.Context, sandboxID string) map[string]any {
	d, err := b.Client.DescribeWorkflowExecution(ctx, workflows.SandboxWorkflowID(sandboxID), "")
	if err != nil || d.GetWorkflowExecutionInfo().GetMemo() == nil {
		return nil
	}
	return decodeMemo(d.GetWorkflowExecutionInfo().GetMemo().GetFields())
}

func decodeMemo(fields map[string]*commonpb.Payload) map[string]any {
	out := map[string]any{}
	dc := converter.GetDefaultDataConverter()
	for k, p := range fields {
		var v any
		if dc.FromPayload(p, &v) == nil {
			out[k] = v
		}
	}
	return out
}

func (b *TemporalBackend) record(ctx context.Context, st *workflows.SandboxState) map[string]any {
	return b.recordWith(st, b.memo(ctx, st.SandboxID))
}

// recordWith renders the seed's sandbox record.
func (b *TemporalBackend) recordWith(st *workflows.SandboxState, memo map[string]any) map[string]any {
	rec := map[string]any{
		"id": st.SandboxID, "state": st.Phase, "workspace_root": memo["workspace_root"], "image": memo["image"],
		"daemon": nil, "daemon_http": nil, "shared_base": nil, "activity_revision": st.Publishes,
		"workspace_session_count": len(st.Sessions), "created": st.Created,
	}
	if st.Container.Daemon.Port > 0 {
		// The daemon serves its RPC and its HTTP routes (/health,
		// /files/list, /forward/...) on the same port.
		rec["daemon"], rec["daemon_http"] = st.Container.Daemon, st.Container.Daemon
	}
	if st.Error != "" {
		rec["error"] = st.Error
	}
	return rec
}

func (b *TemporalBackend) listSandboxes(ctx context.Context) (any, error) {
	fleet, err := b.fleet(ctx)
	if err != nil {
		return nil, err
	}
	recs := make([]map[string]any, 0, len(fleet))
	for _, f := range fleet {
		if f.Err != nil {
			recs = append(recs, map[string]any{"id": f.ID, "state": "unknown", "error": f.Err.Error(), "workspace_root": f.Memo["workspace_root"]})
			continue
		}
		recs = append(recs, b.recordWith(f.State, f.Memo))
	}
	return map[string]any{"sandboxes": recs}, nil
}

// listDirectories lists the directories of p; without p, the allowed
// roots (the only places a workspace_root may be).
func listDirectories(pol *hostpath.Policy, p string) (any, error) {
	if p == "" {
		dirs := []map[string]any{}
		for _, r := range pol.Roots() {
			dirs = append(dirs, map[string]any{"name": filepath.Base(r), "path": r})
		}
		return map[string]any{"path": "", "parent": nil, "truncated": false, "directories": dirs}, nil
	}
	if !filepath.IsAbs(p) {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "path"}, "path must be absolute")
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "path"}, "%v", err)
	}
	dirs := []map[string]any{}
	truncated := false
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if len(dirs) == 500 {
			truncated = true
			break
		}
		dirs = append(dirs, map[string]any{"name": e.Name(), "path": filepath.Join(p, e.Name())})
	}
	return map[string]any{"path": p, "parent": filepath.Dir(p), "truncated": truncated, "directories": dirs}, nil
}

func (b *TemporalBackend) remember(id string, ep activities.Endpoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.endpoints == nil {
		b.endpoints = map[string]activities.Endpoint{}
	}
	b.endpoints[id] = ep
}

func (b *TemporalBackend) forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.endpoints, id)
}

func (b *TemporalBackend) endpoint(ctx context.Context, id string, fresh bool) (activities.Endpoint, error) {
	b.mu.Lock()
	ep, ok := b.endpoints[id]
	b.mu.Unlock()
	if ok && !fresh {
		return ep, nil
	}
	st, err := b.state(ctx, id)
	if err != nil {
		return ep, err
	}
	if st.Phase != workflows.PhaseReady || st.Container.Daemon.Port == 0 {
		return ep, api.Errorf(api.KindInvalidRequest, map[string]any{"sandbox_id": id, "state": st.Phase}, "sandbox %s is %s", id, st.Phase)
	}
	b.remember(id, st.Container.Daemon)
	return st.Container.Daemon, nil
}

// Runtime implements Backend: the op goes straight to the daemon.
func (b *TemporalBackend) Runtime(ctx context.Context, op, sandboxID string, args map[string]any) (any, error) {
	return b.RuntimeProgress(ctx, op, sandboxID, args, nil)
}

// RuntimeProgress implements RuntimeProgressBackend: with progress, the
// daemon streams the command's output lines (stderr ones prefixed
// "[stderr] ") while the call waits.
func (b *TemporalBackend) RuntimeProgress(ctx context.Context, op, sandboxID string, args map[string]any, progress func(string)) (any, error) {
	if sandboxID == "" {
		switch op {
		case "snapshot":
			return b.fleetSnapshot(ctx)
		case "resources":
			return b.fleetResources(ctx)
		}
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"op": op}, "%s needs a sandbox id", op)
	}
	if o, ok := api.LookupOp(op); ok && o.Group == api.GroupObservability {
		// The daemon's views name their sandbox; it does not know its id.
		args = withArg(args, "sandbox_id", sandboxID)
	}
	body, _ := json.Marshal(args)
	ep, err := b.endpoint(ctx, sandboxID, false)
	if err != nil {
		return nil, err
	}
	out, err := b.callDaemon(ctx, sandboxID, ep, op, body, progress)
	var ne net.Error
	if err != nil && (errors.As(err, &ne) || errors.Is(err, errConn)) {
		// The container may have restarted on a new port: look it up again.
		if ep2, e2 := b.endpoint(ctx, sandboxID, true); e2 == nil && ep2 != ep {
			out, err = b.callDaemon(ctx, sandboxID, ep2, op, body, progress)
		}
	}
	if err != nil && !isAPIError(err) {
		return nil, api.Errorf(api.KindInternal, map[string]any{"sandbox_id": sandboxID}, "daemon of %s: %v", sandboxID, err)
	}
	return out, err
}

var errConn = errors.New("daemon connection failed")

func isAPIError(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae)
}

func (b *TemporalBackend) callDaemon(ctx context.Context, sandboxID string, ep activities.Endpoint, op string, body []byte, progress func(string)) (json.RawMessage, error) {
	host := ep.Host
	if host == "" {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(ep.Port)) + "/rpc/" + op
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+activities.DaemonToken(b.Secret, sandboxID))
	if rid := RequestID(ctx); rid != "" {
		req.Header.Set("X-Request-Id", rid)
	}
	if progress != nil {
		req.Header.Set("Accept", api.ContentTypeNDJSON)
	}
	resp, err := b.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errConn, err)
	}
	defer resp.Body.Close()
	if progress != nil && resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), api.ContentTypeNDJSON) {
		return readDaemonStream(resp.Body, progress)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read: %v", errConn, err)
	}
	if len(raw) > MaxBodyBytes {
		return nil, api.Errorf(api.KindInternal, nil, "daemon answer exceeds %d bytes", MaxBodyBytes)
	}
	if resp.StatusCode == http.StatusOK && json.Valid(raw) {
		return json.RawMessage(raw), nil
	}
	var env api.Envelope
	if json.Unmarshal(raw, &env) == nil && env.Error != nil && env.Error.Kind != "" {
		if env.Error.Details == nil {
			env.Error.Details = map[string]any{}
		}
		return nil, env.Error
	}
	return nil, api.Errorf(api.KindInternal, map[string]any{"status": resp.StatusCode}, "daemon answered HTTP %d: %.300s", resp.StatusCode, raw)
}

// workflowsView lists a sandbox's workflow and its publish children, newest
// first, with links into the Temporal UI.
func (b *TemporalBackend) workflowsView(ctx context.Context, sandboxID string, limit int) (any, error) {
	if sandboxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	ns := b.Namespace
	if ns == "" {
		ns = "default"
	}
	query := fmt.Sprintf("WorkflowId = '%s' OR WorkflowId STARTS_WITH 'publish/%s/'", workflows.SandboxWorkflowID(sandboxID), sandboxID)
	out := []map[string]any{}
	var token []byte
	for len(out) < limit {
		resp, err := b.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: ns, Query: query,
			PageSize: int32(min(limit, 1000)), NextPageToken: token})
		if err != nil {
			return nil, mapErr(sandboxID, err)
		}
		for _, e := range resp.GetExecutions() {
			w := map[string]any{"workflow_id": e.GetExecution().GetWorkflowId(), "run_id": e.GetExecution().GetRunId(),
				"type": e.GetType().GetName(), "status": strings.ToLower(strings.TrimPrefix(e.GetStatus().String(), "WORKFLOW_EXECUTION_STATUS_")),
				"start_time": e.GetStartTime().AsTime(), "history_length": e.GetHistoryLength()}
			if ct := e.GetCloseTime(); ct != nil {
				w["close_time"] = ct.AsTime()
			}
			if b.UIAddress != "" {
				w["ui_url"] = fmt.Sprintf("http://%s/namespaces/%s/workflows/%s/%s/history", b.UIAddress, ns,
					url.PathEscape(e.GetExecution().GetWorkflowId()), e.GetExecution().GetRunId())
			}
			out = append(out, w)
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	if len(out) == 0 {
		return nil, notFoundSandbox(sandboxID)
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return map[string]any{"view": "workflows", "sandbox_id": sandboxID, "workflows": out}, nil
}

// readDaemonStream reads a streamed daemon answer: line frames go to
// progress, the result or error frame ends it.
func readDaemonStream(r io.Reader, progress func(string)) (json.RawMessage, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := jsonl.ReadLine(br, MaxBodyBytes)
		if err != nil {
			if err == jsonl.ErrTooLarge {
				return nil, api.Errorf(api.KindInternal, nil, "daemon frame exceeds %d bytes", MaxBodyBytes)
			}
			return nil, fmt.Errorf("%w: stream ended without a result: %v", errConn, err)
		}
		var f struct {
			Line   *api.OutputLine `json:"line"`
			Result json.RawMessage `json:"result"`
			Error  *api.Error      `json:"error"`
		}
		if err := json.Unmarshal(line, &f); err != nil {
			return nil, api.Errorf(api.KindInternal, nil, "daemon stream frame: %v", err)
		}
		switch {
		case f.Line != nil:
			if f.Line.Stream == "stderr" {
				progress("[stderr] " + f.Line.Text)
			} else {
				progress(f.Line.Text)
			}
		case f.Error != nil:
			if f.Error.Details == nil {
				f.Error.Details = map[string]any{}
			}
			return nil, f.Error
		case f.Result != nil:
			return f.Result, nil
		}
	}
}

// publishOutcome is the last progress message of a publish.
func publishOutcome(out any, err error) string {
	if err != nil {
		if ae, ok := err.(*api.Error); ok {
			if cs, ok := ae.Details["conflicts"].([]any); ok {
				return fmt.Sprintf("publish rejected: %d conflicting path(s); nothing committed", len(cs))
			}
		}
		return "publish failed: " + err.Error()
	}
	var res struct {
		Publish struct {
			NoOp     bool `json:"no_op"`
			Revision struct {
				ManifestVersion int64 `json:"manifest_version"`
			} `json:"revision"`
		} `json:"publish"`
	}
	if raw, ok := out.(json.RawMessage); ok && json.Unmarshal(raw, &res) == nil {
		if res.Publish.NoOp {
			return "published: nothing to commit"
		}
		return fmt.Sprintf("published: manifest version %d", res.Publish.Revision.ManifestVersion)
	}
	return "published"
}

// withArg returns args plus k=v, leaving the caller's map as it was.
func withArg(args map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(args)+1)
	for ak, av := range args {
		out[ak] = av
	}
	out[k] = v
	return out
}
