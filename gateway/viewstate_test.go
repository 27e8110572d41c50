package gateway

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/ephemeral-sandbox/sandbox/hostlink"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// viewTemporal answers the two calls a view makes: the run's description
// and the state query (counted).
type viewTemporal struct {
	client.Client
	mu      sync.Mutex
	run     string
	status  enumspb.WorkflowExecutionStatus
	length  int64
	state   *workflows.SandboxState
	queried int
	hold    chan struct{} // non-nil: a query waits for it (a workflow task in flight)
	held    chan struct{} // non-nil: told (without blocking) when a query starts to wait
}

func (f *viewTemporal) DescribeWorkflowExecution(_ context.Context, id, _ string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: &workflowpb.WorkflowExecutionInfo{
		Execution: &commonpb.WorkflowExecution{WorkflowId: id, RunId: f.run}, Status: f.status, HistoryLength: f.length}}, nil
}

func (f *viewTemporal) QueryWorkflow(ctx context.Context, id, _, _ string, _ ...interface{}) (converter.EncodedValue, error) {
	if id == workflows.HostRegistryWorkflowID {
		return nil, serviceerror.NewNotFound("no host registry: a single machine")
	}
	f.mu.Lock()
	f.queried++
	hold, held := f.hold, f.held
	f.mu.Unlock()
	if hold != nil {
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b, err := json.Marshal(f.state)
	return jsonValue(b), err
}

type jsonValue []byte

func (v jsonValue) HasValue() bool            { return len(v) > 0 }
func (v jsonValue) Get(ptr interface{}) error { return json.Unmarshal(v, ptr) }

// countViews gives b fresh metrics and returns the count of its view
// reads from a source.
func countViews(t *testing.T, b *TemporalBackend) func(source string) float64 {
	m := NewMetrics()
	b.viewReads.Store(m.views)
	return func(source string) float64 {
		var v dto.Metric
		require.NoError(t, m.views.WithLabelValues(source).Write(&v))
		return v.GetCounter().GetValue()
	}
}

// A view of a busy sandbox reads the copy its workflow left in this
// process while that copy has seen every event of the run's history, and
// queries otherwise: a newer history, another run, a run that ended, no
// copy.
func TestViewStateReadsTheMirrorOnlyWhileItIsCurrent(t *testing.T) {
	const id = "view-test"
	wid := workflows.SandboxWorkflowID(id)
	t.Cleanup(func() { workflows.ForgetMirrored(wid) })
	queried := &workflows.SandboxState{SandboxID: id, Phase: workflows.PhaseReady, Publishes: 7}
	f := &viewTemporal{run: "run-1", status: enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, length: 40, state: queried}
	b := &TemporalBackend{Client: f}
	reads := countViews(t, b)
	ctx := context.Background()

	st, _, err := b.viewState(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 7, st.Publishes)
	require.Equal(t, 1, f.queried, "no copy: the query")

	require.NoError(t, workflows.Mirror(wid, "run-1", 40, &workflows.SandboxState{SandboxID: id, Phase: workflows.PhaseReady, Publishes: 8}))
	st, _, err = b.viewState(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 8, st.Publishes, "the copy")
	require.Equal(t, 1, f.queried, "no query")
	require.Equal(t, []float64{1, 1, 0}, []float64{reads("query"), reads("copy"), reads("copy_after_wait")})

	for _, c := range []struct {
		name   string
		run    string
		length int64
		status enumspb.WorkflowExecutionStatus
	}{
		{"a newer history", "run-1", 41, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING},
		{"another run", "run-2", 40, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING},
		{"a run that ended", "run-1", 40, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED},
	} {
		before := f.queried
		f.run, f.length, f.status = c.run, c.length, c.status
		st, _, err = b.viewState(ctx, id)
		require.NoError(t, err, c.name)
		require.Equal(t, 7, st.Publishes, "%s: the query's answer", c.name)
		require.Equal(t, before+1, f.queried, c.name)
	}
	_, ok := workflows.MirroredState(wid, "run-1", 40)
	require.False(t, ok, "the copy of a run that ended is dropped")

	// A query held by a workflow task in flight: the copy the next task
	// leaves is served as soon as it is current, without the query's answer.
	f.mu.Lock()
	f.run, f.length, f.status, f.hold, f.held = "run-1", 50, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, make(chan struct{}), make(chan struct{}, 1)
	f.mu.Unlock()
	defer close(f.hold)
	require.NoError(t, workflows.Mirror(wid, "run-1", 45, &workflows.SandboxState{SandboxID: id, Phase: workflows.PhaseReady, Publishes: 8}))
	go func() {
		// The view checked the copy (not current) before it queried: the
		// copy is current from now on.
		<-f.held
		time.Sleep(mirrorRecheck)
		_ = workflows.Mirror(wid, "run-1", 52, &workflows.SandboxState{SandboxID: id, Phase: workflows.PhaseReady, Publishes: 9})
	}()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, _, err = b.viewState(wctx, id)
	require.NoError(t, err, "served by the copy, not the held query")
	require.Equal(t, 9, st.Publishes)
	require.Equal(t, []float64{4, 1, 1}, []float64{reads("query"), reads("copy"), reads("copy_after_wait")})
}

// A gateway without the workflow's worker (a cluster's) reads a busy
// sandbox's state from the forwarder of the host whose worker runs the
// workflow, while that copy is current: at once when it is, asking the
// host that served the last one first; after the next task otherwise,
// without the query's answer; a host that is not live is not asked, and
// one that answers with another sandbox's state is not believed.
func TestViewStateReadsAHostsCopyInACluster(t *testing.T) {
	const id = "view-cluster"
	secret := []byte("deployment secret")
	var mu sync.Mutex
	copyLen := int64(40) // the length of history the host's copy has seen
	asked := map[string]int{}
	serve := func(name string) workflows.HostInfo {
		cert, err := hostlink.LoadOrCreateCert(t.TempDir(), []string{"127.0.0.1"})
		require.NoError(t, err)
		s := &hostlink.Server{Secret: secret, Host: name, State: func(sid, run string, n int64) ([]byte, bool) {
			mu.Lock()
			defer mu.Unlock()
			asked[name]++
			if name == "h1" {
				// A host answering for another sandbox (or with garbage)
				// is not believed.
				return []byte(`{"state":{"sandbox_id":"intruder","phase":"ready","publishes":99},"last_publish":{"txid":"tx-99"}}`), true
			}
			if name != "h2" || sid != id || run != "run-1" || n > copyLen {
				return nil, false
			}
			return []byte(`{"state":{"sandbox_id":"` + id + `","phase":"ready","publishes":9,"host_queue":"eos-host-h2"},` +
				`"last_publish":{"txid":"tx-9","outcome":"committed","publishes":9,"at":"2026-12-07T05:00:00Z"}}`), true
		}}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		addr, _, err := hostlink.Listen(ctx, "127.0.0.1:0", cert, s)
		require.NoError(t, err)
		return workflows.HostInfo{HostBeat: workflows.HostBeat{Name: name, Queue: "eos-host-" + name, Advertise: addr.String(), Fingerprint: cert.Fingerprint},
			LastSeen: time.Now()}
	}
	h1, h2, h3 := serve("h1"), serve("h2"), serve("h3")
	h3.LastSeen = time.Now().Add(-time.Hour) // lost
	f := &viewTemporal{run: "run-1", status: enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, length: 40,
		state: &workflows.SandboxState{SandboxID: id, Phase: workflows.PhaseReady, Publishes: 7}, hold: make(chan struct{})}
	defer close(f.hold) // every query waits: a workflow task in flight
	b := &TemporalBackend{Client: f, Secret: secret}
	b.hostDir.Seed([]workflows.HostInfo{h1, h2, h3}, time.Now().Add(time.Hour))
	reads := countViews(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	st, _, err := b.viewState(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 9, st.Publishes, "h2's copy")
	require.Equal(t, 1.0, reads("host_copy"))
	mu.Lock()
	require.Equal(t, 1, asked["h2"])
	require.LessOrEqual(t, asked["h1"], 1, "the other live host, side by side (its ask may be cut short)")
	require.Zero(t, asked["h3"], "not the lost host")
	mu.Unlock()

	st, _, err = b.viewState(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 9, st.Publishes)
	mu.Lock()
	require.Equal(t, 2, asked["h2"])
	require.LessOrEqual(t, asked["h1"], 1, "the host that served the last copy is asked first, and alone")
	mu.Unlock()

	// A task completed since h2's copy: not served until the next task
	// made the copy current again.
	f.mu.Lock()
	f.length = 45
	f.mu.Unlock()
	mu.Lock()
	askedH1 := asked["h1"]
	mu.Unlock()
	go func() {
		// h2 refused the view's first ask (it then asks the other live
		// hosts, h1; a recheck asks only h2): h2's copy is current from now on.
		for {
			mu.Lock()
			if asked["h1"] > askedH1 {
				copyLen = 46
				mu.Unlock()
				return
			}
			mu.Unlock()
			time.Sleep(mirrorRecheck)
		}
	}()
	st, _, err = b.viewState(ctx, id)
	require.NoError(t, err, "served by h2's copy, not the held query")
	require.Equal(t, 9, st.Publishes)
	require.Equal(t, 1.0, reads("host_copy_after_wait"))
	require.Zero(t, reads("query"))

	// The workflows view's last publish comes from the host's copy too
	// (the query is held: an answer from it would never come).
	out := []map[string]any{{"workflow_id": workflows.SandboxWorkflowID(id), "run_id": "run-1"}}
	b.freshLastPublish(ctx, id, out)
	lp, _ := out[0][workflows.MemoLastPublish].(map[string]any)
	require.Equal(t, "tx-9", lp["txid"], "%v", out)
}
