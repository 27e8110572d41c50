package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/hostdir"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

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
	b.rememberQueue(sandboxID, st.HostQueue)
	return &st, nil
}

// viewState is the sandbox's state for a view (inspect_sandbox, snapshot,
// the fleet): the copy the sandbox workflow left in the process whose
// worker runs it, while that copy is as new as the run's history
// (workflows.MirroredState), else the state query. The copy is this
// process's when its workers run the workflow; else the forwarder of the
// cluster host whose worker runs it serves it (hostCopy: the host that
// served the sandbox's last copy is asked first, the others side by side
// while the query is on its way). A query waits for the workflow task in
// flight and is answered by the next one; while it waits, the copy is
// checked again every mirrorRecheck, and served once the next task has
// made it current. With the state, the run's memo when a describe had it.
func (b *TemporalBackend) viewState(ctx context.Context, sandboxID string) (*workflows.SandboxState, map[string]any, error) {
	if sandboxID == "" {
		return nil, nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	wid := workflows.SandboxWorkflowID(sandboxID)
	rv, described := b.describeRun(ctx, sandboxID)
	memo := rv.memo
	if described && rv.running {
		if st, ok := b.localCopy(sandboxID, rv); ok {
			b.countView("copy")
			return st, memo, nil
		}
	}
	type answer struct {
		st  *workflows.SandboxState
		err error
	}
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	queried := make(chan answer, 1)
	go func() {
		st, err := b.state(qctx, sandboxID)
		queried <- answer{st, err}
	}()
	// Another process runs the workflow: a cluster host's worker, whose
	// forwarder serves its copy.
	remote := !workflows.HasMirrored(wid) && b.hasHosts(ctx)
	var fanned chan *hostCopied
	if remote && described && rv.running {
		fanned = make(chan *hostCopied, 1)
		go func() { fanned <- b.hostCopy(qctx, sandboxID, rv, true) }()
	}
	var recheck <-chan time.Time
	if remote || workflows.HasMirrored(wid) {
		t := time.NewTicker(mirrorRecheck)
		defer t.Stop()
		recheck = t.C
	}
	for {
		select {
		case a := <-queried:
			if a.err != nil {
				return nil, nil, a.err
			}
			if memo == nil {
				memo = b.memo(ctx, sandboxID)
			}
			b.countView("query")
			return a.st, memo, nil
		case c := <-fanned:
			fanned = nil
			if c != nil {
				b.countView("host_copy")
				return c.state, memo, nil
			}
		case <-recheck:
			rv, ok := b.describeRun(ctx, sandboxID)
			if !ok || !rv.running {
				continue // the query answers
			}
			if st, ok := b.localCopy(sandboxID, rv); ok {
				b.countView("copy_after_wait")
				return st, rv.memo, nil
			}
			if remote {
				if c := b.hostCopy(ctx, sandboxID, rv, false); c != nil {
					b.countView("host_copy_after_wait")
					return c.state, rv.memo, nil
				}
			}
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// mirrorRecheck is how often a view waiting on the state query checks the
// sandbox workflow's copy again.
const mirrorRecheck = 20 * time.Millisecond

// runView is what one describe of a sandbox's workflow said: its run, the
// length of its history, whether it runs, and its memo.
type runView struct {
	run     string
	length  int64
	running bool
	memo    map[string]any
}

func (b *TemporalBackend) describeRun(ctx context.Context, sandboxID string) (runView, bool) {
	wid := workflows.SandboxWorkflowID(sandboxID)
	d, err := b.Client.DescribeWorkflowExecution(ctx, wid, "")
	if err != nil {
		return runView{}, false
	}
	info := d.GetWorkflowExecutionInfo()
	rv := runView{run: info.GetExecution().GetRunId(), length: info.GetHistoryLength(), running: info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING}
	if m := info.GetMemo(); m != nil {
		rv.memo = decodeMemo(m.GetFields())
	}
	if !rv.running {
		workflows.ForgetMirrored(wid)
	}
	return rv, true
}

// localCopy is the copy in this process, if it is current for rv.
func (b *TemporalBackend) localCopy(sandboxID string, rv runView) (*workflows.SandboxState, bool) {
	st, ok := workflows.MirroredState(workflows.SandboxWorkflowID(sandboxID), rv.run, rv.length)
	if ok {
		b.rememberQueue(sandboxID, st.HostQueue)
	}
	return st, ok
}

// hostCopyTimeout bounds one ask of a host's forwarder for a copy; a
// recheck's ask, made while the query's answer may be waiting, gets
// hostRecheckTimeout.
const (
	hostCopyTimeout    = 250 * time.Millisecond
	hostRecheckTimeout = 50 * time.Millisecond
)

// hasHosts reports whether the registry lists hosts of a cluster.
func (b *TemporalBackend) hasHosts(ctx context.Context) bool {
	hosts, err := b.hosts(ctx)
	return err == nil && len(hosts) > 0
}

// hostCopy is the copy of the sandbox's state, current for rv, that a
// cluster host's worker holds (nil: none has one): the host that served
// the last one is asked first; with fanOut, then every other live host
// side by side, and the one that has it is remembered.
func (b *TemporalBackend) hostCopy(ctx context.Context, sandboxID string, rv runView, fanOut bool) *hostCopied {
	hosts, err := b.hosts(ctx)
	if err != nil {
		return nil
	}
	b.mu.Lock()
	last := b.copyHosts[sandboxID]
	b.mu.Unlock()
	timeout := hostCopyTimeout
	if !fanOut {
		timeout = hostRecheckTimeout
	}
	ask := func(ctx context.Context, h workflows.HostInfo) *hostCopied {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, ok, err := b.daemons().MirroredState(ctx, hostdir.Via(h), sandboxID, rv.run, rv.length)
		var c workflows.MirroredCopy
		var st workflows.SandboxState
		var last *workflows.PublishRecord
		if err != nil || !ok || json.Unmarshal(raw, &c) != nil || json.Unmarshal(c.State, &st) != nil || st.SandboxID != sandboxID {
			return nil
		}
		if len(c.LastPublish) > 0 && json.Unmarshal(c.LastPublish, &last) != nil {
			return nil
		}
		b.mu.Lock()
		if b.copyHosts == nil {
			b.copyHosts = map[string]string{}
		}
		b.copyHosts[sandboxID] = h.Queue
		b.mu.Unlock()
		b.rememberQueue(sandboxID, st.HostQueue)
		return &hostCopied{state: &st, lastPublish: last}
	}
	now := time.Now()
	var others []workflows.HostInfo
	for _, h := range hosts {
		if !h.Live(now) || hostdir.Via(h) == nil || b.isLocalQueue(h.Queue) {
			continue
		}
		if h.Queue == last {
			if c := ask(ctx, h); c != nil {
				return c
			}
			continue
		}
		others = append(others, h)
	}
	if !fanOut || len(others) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	found := make(chan *hostCopied, len(others))
	for _, h := range others {
		go func(h workflows.HostInfo) { found <- ask(ctx, h) }(h)
	}
	for range others {
		if c := <-found; c != nil {
			return c
		}
	}
	return nil
}

// clusterCopy is hostCopy for a run of a workflow this process does not
// run, when the registry lists hosts (nil otherwise).
func (b *TemporalBackend) clusterCopy(ctx context.Context, sandboxID string, rv runView) *hostCopied {
	if !rv.running || workflows.HasMirrored(workflows.SandboxWorkflowID(sandboxID)) || !b.hasHosts(ctx) {
		return nil
	}
	return b.hostCopy(ctx, sandboxID, rv, true)
}

// hostCopied is a copy a host served: the state and the run's last
// publish (nil: none yet).
type hostCopied struct {
	state       *workflows.SandboxState
	lastPublish *workflows.PublishRecord
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
	if st.SharedRootHash != "" {
		// The seed's shared_base: one read-only base under every sandbox
		// of a group created together, one root_hash.
		rec["shared_base"] = map[string]any{"source": memo["workspace_root"], "target": "/workspace", "root_hash": st.SharedRootHash, "readonly": true}
	}
	if st.Error != "" {
		rec["error"] = st.Error
	}
	if h, ok := b.cachedHost(st.HostQueue); ok && !b.isLocalQueue(st.HostQueue) {
		// A cluster's sandbox names its host, and says when it is lost.
		rec["host"] = h.Name
		if !h.Live(time.Now()) {
			rec["availability"] = "unavailable"
		}
	}
	addLifecycle(rec, st)
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

func (b *TemporalBackend) remember(id string, ep api.Endpoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.endpoints == nil {
		b.endpoints = map[string]api.Endpoint{}
	}
	b.endpoints[id] = ep
}

func (b *TemporalBackend) forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.endpoints, id)
	delete(b.directs, id)
}

// rememberContainer remembers where a sandbox's daemon listens: its
// published endpoint and, when the record has it, its direct address.
func (b *TemporalBackend) rememberContainer(id string, c workflows.ContainerInfo) {
	b.remember(id, c.Daemon)
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.DaemonDirect == nil {
		delete(b.directs, id)
		return
	}
	if b.directs == nil {
		b.directs = map[string][2]api.Endpoint{}
	}
	b.directs[id] = [2]api.Endpoint{c.Daemon, *c.DaemonDirect}
}

// directFor is sandbox id's direct daemon address if it came with the
// published endpoint ep (a record of the same container start), else nil.
func (b *TemporalBackend) directFor(id string, ep api.Endpoint) *api.Endpoint {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.directs[id]
	if !ok || d[0] != ep {
		return nil
	}
	return &d[1]
}

// workflowsView lists a sandbox's workflow (with its last_publish) and the
// publish children of runs from before publishes were one activity, newest
// first, with links into the Temporal UI.
func (b *TemporalBackend) workflowsView(ctx context.Context, sandboxID string, limit int) (any, error) {
	if sandboxID == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	out, err := b.listWorkflows(ctx, sandboxQuery(sandboxID), limit)
	if err != nil {
		return nil, mapErr(sandboxID, err)
	}
	if len(out) == 0 {
		return nil, notFoundSandbox(sandboxID)
	}
	b.freshLastPublish(ctx, sandboxID, out)
	return map[string]any{"view": "workflows", "sandbox_id": sandboxID, "workflows": out}, nil
}

// freshLastPublish sets the last_publish of the sandbox's running
// workflow in out from the workflow itself: its last_publish query (the
// memo lags a publish by up to a second, visibility — the list — some
// time more), else its memo as describe shows it (a run that has not
// published yet: its memo is the previous run's).
func (b *TemporalBackend) freshLastPublish(ctx context.Context, sandboxID string, out []map[string]any) {
	wid := workflows.SandboxWorkflowID(sandboxID)
	d, err := b.Client.DescribeWorkflowExecution(ctx, wid, "")
	if err != nil {
		return
	}
	info := d.GetWorkflowExecutionInfo()
	var lp any
	asMap := func(rec *workflows.PublishRecord) {
		var m map[string]any
		if raw, err := json.Marshal(rec); err == nil && json.Unmarshal(raw, &m) == nil {
			lp = m
		}
	}
	// The copy the workflow left in this process, while current (as the
	// views read the state: viewState); else the query, which waits for
	// the workflow task in flight.
	rv := runView{run: info.GetExecution().GetRunId(), length: info.GetHistoryLength(), running: info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING}
	if rec, ok := workflows.MirroredLastPublish(wid, rv.run, rv.length); ok {
		if rec != nil {
			asMap(rec)
		}
	} else if c := b.clusterCopy(ctx, sandboxID, rv); c != nil {
		if c.lastPublish != nil {
			asMap(c.lastPublish)
		}
	} else if v, err := b.Client.QueryWorkflow(ctx, wid, info.GetExecution().GetRunId(), workflows.QueryLastPublish); err == nil && v.HasValue() {
		var rec *workflows.PublishRecord
		if v.Get(&rec) == nil && rec != nil {
			asMap(rec)
		}
	}
	if lp == nil {
		lp = decodeMemo(info.GetMemo().GetFields())[workflows.MemoLastPublish]
	}
	if lp == nil {
		return
	}
	for _, w := range out {
		if w["run_id"] == info.GetExecution().GetRunId() {
			w[workflows.MemoLastPublish] = lp
		}
	}
}

// sandboxQuery selects a sandbox's workflow and its publishes (the id is
// checked against api.PatternID before it gets here).
func sandboxQuery(sandboxID string) string {
	return fmt.Sprintf("(WorkflowId = '%s' OR WorkflowId STARTS_WITH 'publish/%s/')", workflows.SandboxWorkflowID(sandboxID), sandboxID)
}

// listWorkflows runs a visibility query, newest first, at most limit.
func (b *TemporalBackend) listWorkflows(ctx context.Context, query string, limit int) ([]map[string]any, error) {
	out := []map[string]any{}
	var token []byte
	for len(out) < limit {
		resp, err := b.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: b.namespace(), Query: query,
			PageSize: int32(min(limit, 1000)), NextPageToken: token})
		if err != nil {
			return nil, err
		}
		for _, e := range resp.GetExecutions() {
			w := map[string]any{"workflow_id": e.GetExecution().GetWorkflowId(), "run_id": e.GetExecution().GetRunId(),
				"type": e.GetType().GetName(), "status": statusName(e.GetStatus()),
				"start_time": e.GetStartTime().AsTime(), "history_length": e.GetHistoryLength()}
			if ct := e.GetCloseTime(); ct != nil {
				w["close_time"] = ct.AsTime()
			}
			// A sandbox's latest publish (each publish's record is in the
			// workflow's history, one memo upsert per publish).
			if lp := decodeMemo(e.GetMemo().GetFields())[workflows.MemoLastPublish]; lp != nil {
				w[workflows.MemoLastPublish] = lp
			}
			if u := b.uiURL(e.GetExecution().GetWorkflowId(), e.GetExecution().GetRunId()); u != "" {
				w["ui_url"] = u
			}
			out = append(out, w)
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func statusName(s enumspb.WorkflowExecutionStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "WORKFLOW_EXECUTION_STATUS_"))
}

// uiURL links a workflow's page in the Temporal UI ("" without a UI).
// UIAddress is host:port (the embedded UI) or a base URL (a cluster's UI,
// --temporal-ui-url).
func (b *TemporalBackend) uiURL(workflowID, runID string) string {
	if b.UIAddress == "" {
		return ""
	}
	base := b.UIAddress
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u := fmt.Sprintf("%s/namespaces/%s/workflows/%s", strings.TrimRight(base, "/"), url.PathEscape(b.namespace()), url.PathEscape(workflowID))
	if runID != "" {
		u += "/" + url.PathEscape(runID)
	}
	return u + "/history"
}
