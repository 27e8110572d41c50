package lifecycle_test

// Updates on a real embedded Temporal across the sandbox workflow's
// continue-as-new hand-overs, with a fake daemon (its local call answers at
// once): the workflow and the server are the real ones.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/grpc"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/worker"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// fakeDaemon answers the sandbox workflow's local daemon calls and counts
// them by request id (a workflow that ran an update twice calls twice).
type fakeDaemon struct {
	mu    sync.Mutex
	calls map[string]int // op + " " + request id
	n     atomic.Int64
}

func (f *fakeDaemon) call(_ context.Context, c workflows.DaemonCall) (json.RawMessage, error) {
	f.mu.Lock()
	f.calls[c.Op+" "+c.RequestID]++
	f.mu.Unlock()
	if c.Op == "create_workspace_session" {
		var r workflows.CreateSessionRequest
		if err := json.Unmarshal(c.Args, &r); err != nil {
			return nil, err
		}
		if r.Agent == "refuse" { // the daemon's own refusal: the update was accepted and fails
			return nil, apperr.Newf(api.KindResourceExhausted, nil, "no room for another session")
		}
		return json.Marshal(api.SessionInfo{WorkspaceSessionID: fmt.Sprintf("ws-%d", f.n.Add(1)), NetworkProfile: "none"})
	}
	var a workflows.SessionRequest
	if err := json.Unmarshal(c.Args, &a); err != nil {
		return nil, err
	}
	return json.Marshal(api.SessionDestroyed{WorkspaceSessionID: a.WorkspaceSessionID, Destroyed: true})
}

// refusals counts the updates a workflow refused as KindContinuing (the
// hand-over this test is about), as the client's connection sees them.
type refusals struct{ n atomic.Int64 }

func (r *refusals) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if u, ok := reply.(*workflowservice.UpdateWorkflowExecutionResponse); ok && err == nil &&
		u.GetOutcome().GetFailure().GetApplicationFailureInfo().GetType() == workflows.KindContinuing {
		r.n.Add(1)
	}
	return err
}

func startReadySandbox(t testing.TB) (client.Client, *fakeDaemon, *refusals, string) {
	t.Helper()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ref := &refusals{}
	svc, err := worker.Start(context.Background(), worker.Options{StateDir: t.TempDir(), EmbeddedAddress: "127.0.0.1:0", Secret: secret,
		NoWorkers: true, ClientInterceptors: []grpc.UnaryClientInterceptor{ref.intercept}, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(svc.Stop)
	c := svc.Client
	fd := &fakeDaemon{calls: map[string]int{}}
	w := sdkworker.New(c, workflows.TaskQueue, sdkworker.Options{DisableRegistrationAliasing: true})
	w.RegisterWorkflowWithOptions(workflows.SandboxWorkflow, workflow.RegisterOptions{Name: workflows.SandboxWorkflowName})
	w.RegisterActivityWithOptions(fd.call, activity.RegisterOptions{Name: workflows.ActCallDaemonHere})
	w.RegisterActivityWithOptions(func(ctx context.Context) error { return new(activities.Activities).Pass(ctx) }, activity.RegisterOptions{Name: workflows.ActPass})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := "can-" + hex.EncodeToString(b)
	st := &workflows.SandboxState{SandboxID: id, Phase: workflows.PhaseReady, Sessions: map[string]*workflows.SessionRecord{}, Created: time.Now().UTC()}
	_, err = c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
		workflows.SandboxWorkflowName, workflows.SandboxInput{Spec: workflows.SandboxSpec{SandboxID: id, Image: "none"}, State: st})
	require.NoError(t, err)
	return c, fd, ref, id
}

// TestUpdatesAcrossContinueAsNew: agents creating and destroying sessions
// side by side never see the sandbox's workflow continue as new. It does,
// several times (about every hundred updates); every update is answered,
// each exactly once (one daemon call per update, none run again on the next
// run), and the record the last run holds is what the updates did.
func TestUpdatesAcrossContinueAsNew(t *testing.T) {
	c, fd, ref, id := startReadySandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const agents, cycles = 6, 40
	errs := make(chan error, agents)
	var mu sync.Mutex
	var worst []time.Duration
	slowest := func(d time.Duration) { mu.Lock(); worst = append(worst, d); mu.Unlock() }
	var firstID, firstSession string // agent 0's first create, in the first run
	for a := 0; a < agents; a++ {
		go func() {
			for k := 0; k < cycles; k++ {
				var info api.SessionInfo
				t0 := time.Now()
				uid := fmt.Sprintf("create-%d-%d", a, k)
				if err := lifecycle.Update(ctx, c, id, workflows.UpdateCreateSession, uid, &info, workflows.CreateSessionRequest{}); err != nil {
					errs <- fmt.Errorf("create %d: %w", k, err)
					return
				}
				if a == 0 && k == 0 {
					firstID, firstSession = uid, info.WorkspaceSessionID
				}
				var gone api.SessionDestroyed
				if err := lifecycle.Update(ctx, c, id, workflows.UpdateDestroySession, "", &gone, workflows.SessionRequest{WorkspaceSessionID: info.WorkspaceSessionID}); err != nil {
					errs <- fmt.Errorf("destroy %s: %w", info.WorkspaceSessionID, err)
					return
				}
				slowest(time.Since(t0))
			}
			errs <- nil
		}()
	}
	for a := 0; a < agents; a++ {
		require.NoError(t, <-errs)
	}
	v, err := c.QueryWorkflow(ctx, workflows.SandboxWorkflowID(id), "", workflows.QueryState)
	require.NoError(t, err)
	var st workflows.SandboxState
	require.NoError(t, v.Get(&st))
	require.Empty(t, st.Sessions, "every session created was destroyed")
	require.GreaterOrEqual(t, st.Runs, 3, "the workflow continued as new more than once")
	// An update's result is found in the run that has it, not only the
	// current one (wait_operation of an async operation).
	var again api.SessionInfo
	require.NoError(t, lifecycle.WaitUpdate(ctx, c, "", workflows.SandboxWorkflowID(id), firstID, &again))
	require.Equal(t, firstSession, again.WorkspaceSessionID)
	t0 := time.Now()
	require.ErrorIs(t, lifecycle.WaitUpdate(ctx, c, "", workflows.SandboxWorkflowID(id), "never-sent", nil), lifecycle.ErrUpdateNotFound)
	t.Logf("an update nobody sent: not found after asking %d runs in %v", st.Runs, time.Since(t0))
	var nf *serviceerror.NotFound
	require.ErrorAs(t, lifecycle.WaitUpdate(ctx, c, "", workflows.SandboxWorkflowID("nobody"), "never-sent", nil), &nf, "no such workflow")

	fd.mu.Lock()
	defer fd.mu.Unlock()
	require.Len(t, fd.calls, 2*agents*cycles, "one daemon call per update")
	for k, n := range fd.calls {
		require.Equal(t, 1, n, "%s called %d times", k, n)
	}
	if os.Getenv("ZZ_HIST") != "" {
		it := c.GetWorkflowHistory(ctx, workflows.SandboxWorkflowID(id), "", false, 0)
		var evs []string
		first := time.Time{}
		for it.HasNext() {
			e, err := it.Next()
			require.NoError(t, err)
			if first.IsZero() {
				first = e.GetEventTime().AsTime()
			}
			evs = append(evs, fmt.Sprintf("%4d %8.1fms %s", e.GetEventId(), float64(e.GetEventTime().AsTime().Sub(first).Microseconds())/1000, e.GetEventType()))
		}
		t.Logf("current run's first events:\n%s", strings.Join(evs[:min(12, len(evs))], "\n"))
		it = c.GetWorkflowHistory(ctx, workflows.SandboxWorkflowID(id), "", false, 0)
		e0, _ := it.Next()
		prev := e0.GetWorkflowExecutionStartedEventAttributes().GetContinuedExecutionRunId()
		it = c.GetWorkflowHistory(ctx, workflows.SandboxWorkflowID(id), prev, false, 0)
		evs = nil
		for it.HasNext() {
			e, _ := it.Next()
			evs = append(evs, fmt.Sprintf("%4d %s %s", e.GetEventId(), e.GetEventTime().AsTime().Format("05.000"), e.GetEventType()))
		}
		t.Logf("previous run's last events:\n%s", strings.Join(evs[max(0, len(evs)-40):], "\n"))
		t.Logf("current run started %s", first.Format("05.000"))
	}
	sort.Slice(worst, func(i, j int) bool { return worst[i] > worst[j] })
	t.Logf("slowest cycles: %v; median %v", worst[:8], worst[len(worst)/2])
	t.Logf("%d updates over %d runs; %d refused during a hand-over and sent again", 2*agents*cycles, st.Runs, ref.n.Load())
}

// TestAsyncUpdateRefusedIsNotAccepted: an update sent async that the
// workflow's validator refuses is answered with the refusal, not as
// accepted; one the workflow accepted is accepted, even when it failed
// before the answer, and WaitUpdate then answers its failure.
func TestAsyncUpdateRefusedIsNotAccepted(t *testing.T) {
	c, fd, _, id := startReadySandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acc, err := lifecycle.UpdateAsync(ctx, c, id, workflows.UpdateDestroySession, "", workflows.SessionRequest{WorkspaceSessionID: "ws-nobody"})
	require.Nil(t, acc)
	e, ok := apperr.From(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, api.KindNotFound, e.Kind)

	acc, err = lifecycle.UpdateAsync(ctx, c, id, workflows.UpdateCreateSession, "", workflows.CreateSessionRequest{})
	require.NoError(t, err)
	require.Equal(t, "accepted", acc.Status)
	require.Eventually(t, func() bool { return fd.n.Load() == 1 }, 30*time.Second, 10*time.Millisecond)

	acc, err = lifecycle.UpdateAsync(ctx, c, id, workflows.UpdateCreateSession, "doomed", workflows.CreateSessionRequest{Agent: "refuse"})
	require.NoError(t, err)
	require.Equal(t, "doomed", acc.UpdateID)
	e, ok = apperr.From(lifecycle.WaitUpdate(ctx, c, "", acc.WorkflowID, acc.UpdateID, nil))
	require.True(t, ok)
	require.Equal(t, api.KindResourceExhausted, e.Kind)
}

// BenchmarkUpdatesAcrossHandOvers: one agent's session creates and
// destroys through the sandbox workflow on the embedded Temporal, with the
// daemon's part answered at once: what the workflow and the server cost per
// update over many runs (a hand-over about every hundred updates), the
// process's CPU per update (server, worker and client are this process),
// and the slowest update (one that met a hand-over). make bench-detail.
func BenchmarkUpdatesAcrossHandOvers(b *testing.B) {
	c, _, ref, id := startReadySandbox(b)
	ctx := context.Background()
	const cycles = 1000
	for i := 0; i < b.N; i++ {
		var ds []time.Duration
		cpu0 := processCPU()
		for k := 0; k < cycles; k++ {
			t0 := time.Now()
			var info api.SessionInfo
			require.NoError(b, lifecycle.Update(ctx, c, id, workflows.UpdateCreateSession, "", &info, workflows.CreateSessionRequest{}))
			t1 := time.Now()
			require.NoError(b, lifecycle.Update(ctx, c, id, workflows.UpdateDestroySession, "", nil, workflows.SessionRequest{WorkspaceSessionID: info.WorkspaceSessionID}))
			ds = append(ds, t1.Sub(t0), time.Since(t1))
		}
		cpu := processCPU() - cpu0
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(ds[len(ds)/2]), "update-p50-ms")
		b.ReportMetric(ms(ds[len(ds)*99/100]), "update-p99-ms")
		b.ReportMetric(ms(ds[len(ds)-1]), "update-max-ms")
		b.ReportMetric(ms(cpu/time.Duration(len(ds))), "cpu-ms/update")
		v, err := c.QueryWorkflow(ctx, workflows.SandboxWorkflowID(id), "", workflows.QueryState)
		require.NoError(b, err)
		var st workflows.SandboxState
		require.NoError(b, v.Get(&st))
		b.ReportMetric(float64(st.Runs), "runs")
		b.ReportMetric(float64(ref.n.Load()), "refused-and-resent")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
