package worker

// Lifecycle benchmarks through the workflows, on the embedded Temporal with
// real Docker and the real daemon (make bench). Each benchmark takes a fixed
// number of samples per iteration (run with -benchtime 1x) and reports
// latency percentiles with b.ReportMetric. Targets: DESIGN.md §7.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

func report(b *testing.B, name string, ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	pct := func(p float64) float64 {
		i := int(float64(len(ds))*p+0.999999) - 1
		if i < 0 {
			i = 0
		}
		return float64(ds[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), name+"-p50-ms")
	b.ReportMetric(pct(0.95), name+"-p95-ms")
	b.ReportMetric(pct(0.99), name+"-p99-ms")
}

// benchStack is startStack for benchmarks (startStack takes *testing.T).
func benchStack(b *testing.B) (*stack, string, *workflows.SandboxState) {
	s := startStackTB(b)
	ws := b.TempDir()
	require.NoError(b, os.WriteFile(filepath.Join(ws, "f.txt"), []byte("x\n"), 0o644))
	id, st := s.createTB(b, ws)
	return s, id, st
}

func BenchmarkSessionCreateThroughWorkflow(b *testing.B) {
	s, id, _ := benchStack(b)
	const n = 60
	for i := 0; i < b.N; i++ {
		var create, destroy []time.Duration
		for k := 0; k < n; k++ {
			var out map[string]any
			t0 := time.Now()
			require.NoError(b, s.resend(id, workflows.UpdateCreateSession, &out, workflows.CreateSessionRequest{}))
			create = append(create, time.Since(t0))
			t0 = time.Now()
			require.NoError(b, s.resend(id, workflows.UpdateDestroySession, &out, workflows.SessionRequest{WorkspaceSessionID: out["workspace_session_id"].(string)}))
			destroy = append(destroy, time.Since(t0))
		}
		report(b, "create", create)
		report(b, "destroy", destroy)
	}
}

func BenchmarkSmallPublishThroughWorkflow(b *testing.B) {
	s, id, st := benchStack(b)
	const n = 40
	for i := 0; i < b.N; i++ {
		var pub []time.Duration
		for k := 0; k < n; k++ {
			var out map[string]any
			require.NoError(b, s.resend(id, workflows.UpdateCreateSession, &out, workflows.CreateSessionRequest{}))
			ws := out["workspace_session_id"].(string)
			s.daemonTB(b, id, st.Container.Daemon, "file_write", map[string]any{"path": fmt.Sprintf("p/%d-%d.txt", i, k), "content": "small change\n", "workspace_session_id": ws})
			t0 := time.Now()
			require.NoError(b, s.resend(id, workflows.UpdatePublish, &out, workflows.PublishRequest{WorkspaceSessionID: ws}))
			pub = append(pub, time.Since(t0))
		}
		report(b, "publish", pub)
	}
}

func BenchmarkSandboxCreate1kFiles(b *testing.B) {
	s := startStackTB(b)
	ws := b.TempDir()
	for i := 0; i < 1000; i++ {
		p := filepath.Join(ws, fmt.Sprintf("pkg%02d", i%40), fmt.Sprintf("file%04d.go", i))
		require.NoError(b, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(b, os.WriteFile(p, []byte(fmt.Sprintf("package p\n\n// file %d\nfunc F%d() int { return %d }\n", i, i, i)), 0o644))
	}
	const n = 5
	for i := 0; i < b.N; i++ {
		var create []time.Duration
		for k := 0; k < n; k++ {
			t0 := time.Now()
			id, _ := s.createTB(b, ws)
			create = append(create, time.Since(t0))
			var st workflows.SandboxState
			require.NoError(b, s.resend(id, workflows.UpdateDestroy, &st))
		}
		report(b, "create", create)
	}
}

// resend is s.update through lifecycle.Update, which sends an update
// again when the sandbox refused it for its hand-over to the next run (a
// benchmark's thousands of updates cross several).
func (s *stack) resend(id, name string, out any, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return lifecycle.Update(ctx, s.svc.Client, id, name, "", out, args...)
}

// TB variants of the integration helpers.

func startStackTB(b *testing.B) *stack { return startStackFor(b) }

func (s *stack) createTB(tb testing.TB, workspace string) (string, *workflows.SandboxState) {
	id := "bench-" + randHex(6)
	tb.Cleanup(func() { _ = s.acts.RemoveSandbox(context.Background(), id) })
	_, err := s.svc.Client.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
		workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue,
			Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: workspace}})
	require.NoError(tb, err)
	var st workflows.SandboxState
	require.NoError(tb, s.resend(id, workflows.UpdateWaitReady, &st))
	return id, &st
}
