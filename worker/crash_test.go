package worker

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// The crash tests run the workers in a child process (this test binary
// again) against a Temporal server in the test process, SIGKILL it at a
// failpoint right after a side effect and before Temporal records it, start
// a fresh worker, and check the operation completed exactly once.

const (
	childEnv     = "EOS_TEST_WORKER_CHILD"
	childSecret  = "EOS_TEST_SECRET"
	childQueue   = "EOS_TEST_HOST_QUEUE"
	childDaemon  = "EOS_TEST_DAEMON_BIN"
	childSeccomp = "EOS_TEST_SECCOMP"
)

// TestWorkerChild is the child side; it does nothing in a normal run.
func TestWorkerChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		return
	}
	secret, err := hex.DecodeString(os.Getenv(childSecret))
	require.NoError(t, err)
	profile, err := os.ReadFile(os.Getenv(childSeccomp))
	require.NoError(t, err)
	dc, err := activities.NewDockerClient()
	require.NoError(t, err)
	acts := activities.New(activities.Config{DaemonBinary: os.Getenv(childDaemon), SeccompProfile: string(profile), Secret: secret, WorkerID: "crash-test",
		HostPaths: testenv.HostPaths(t)}, dc)
	// Start arms the failpoint the environment names.
	svc, err := Start(context.Background(), Options{TemporalAddress: os.Getenv("TEMPORAL_ADDRESS"), HostQueue: os.Getenv(childQueue),
		Secret: secret, Activities: acts, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer svc.Stop()
	select {} // until the parent (or a failpoint) kills us
}

type crashRig struct {
	t      *testing.T
	dev    *DevServer
	c      client.Client
	queue  string
	secret []byte
	env    []string
	child  *exec.Cmd
	done   chan error
}

func newCrashRig(t *testing.T) *crashRig {
	testenv.RequireDocker(t)
	secret := []byte(randHex(32))
	dev, err := StartDevServer(context.Background(), DevServerOptions{StateDir: t.TempDir(), Address: "127.0.0.1:0", UIAddress: "off",
		Secret: secret, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(dev.Stop)
	c, err := client.Dial(client.Options{HostPort: dev.Address, Logger: quietLogger{}, HeadersProvider: Headers(secret)})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	seccomp := filepath.Join(testenv.RepoRoot(), "sandboxinit", "runtime", "seccomp.json")
	r := &crashRig{t: t, dev: dev, c: c, queue: "eos-host-crash-" + randHex(4), secret: secret}
	r.env = append(os.Environ(), childEnv+"=1", "TEMPORAL_ADDRESS="+dev.Address, childQueue+"="+r.queue,
		childSecret+"="+hex.EncodeToString(secret), childDaemon+"="+testenv.DaemonBinary(t), childSeccomp+"="+seccomp)
	t.Cleanup(r.kill)
	return r
}

// spawn starts a worker child, armed with failpoint fp ("" = none).
func (r *crashRig) spawn(fp string) {
	r.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerChild$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(append([]string{}, r.env...), FailpointEnv+"="+fp)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	require.NoError(r.t, cmd.Start())
	r.child, r.done = cmd, make(chan error, 1)
	go func(done chan error) { done <- cmd.Wait() }(r.done)
}

func (r *crashRig) kill() {
	if r.child != nil && r.child.Process != nil {
		_ = r.child.Process.Kill()
		<-r.done
		r.child = nil
	}
}

// awaitFailpoint waits until the armed child killed itself.
func (r *crashRig) awaitFailpoint(fp string) {
	r.t.Helper()
	select {
	case err := <-r.done:
		var ee *exec.ExitError
		require.True(r.t, errors.As(err, &ee), "worker exited without dying at %s: %v", fp, err)
		ws := ee.Sys().(syscall.WaitStatus)
		require.True(r.t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "worker at %s: %v", fp, err)
		r.child = nil
	case <-time.After(3 * time.Minute):
		r.t.Fatalf("the worker never reached failpoint %s", fp)
	}
}

func (r *crashRig) update(id, name string, out any, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h, err := r.c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: workflows.SandboxWorkflowID(id),
		UpdateName: name, Args: args, WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		return err
	}
	return h.Get(ctx, out)
}

func (r *crashRig) startSandbox(id, workspace string) {
	r.t.Helper()
	_, err := r.c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
		workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: r.queue,
			Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: workspace}})
	require.NoError(r.t, err)
}

func (r *crashRig) acts() *activities.Activities {
	dc, err := activities.NewDockerClient()
	require.NoError(r.t, err)
	return activities.New(activities.Config{Secret: r.secret, HostPaths: testenv.HostPaths(r.t)}, dc)
}

// readySandbox starts a worker and a sandbox over a workspace whose f.txt
// holds content, waits until it is ready, and returns its id, a stack to
// call its daemon with, and the daemon's endpoint.
func (r *crashRig) readySandbox(content string) (string, *stack, api.Endpoint) {
	r.t.Helper()
	ws := r.t.TempDir()
	require.NoError(r.t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte(content), 0o644))
	id := "crash-" + randHex(5)
	r.t.Cleanup(func() { _ = r.acts().RemoveSandbox(context.Background(), id) })
	r.spawn("")
	r.startSandbox(id, ws)
	var st workflows.SandboxState
	require.NoError(r.t, r.update(id, workflows.UpdateWaitReady, &st))
	return id, &stack{t: r.t, secret: r.secret}, st.Container.Daemon
}

// crashDuring restarts the worker with failpoint fp armed, runs update
// until that worker kills itself there, starts a worker without it, and
// returns what update answered once the new worker finished its work.
func (r *crashRig) crashDuring(fp string, update func(out *map[string]any) error) (map[string]any, error) {
	r.t.Helper()
	r.kill()
	r.spawn(fp)
	type result struct {
		out map[string]any
		err error
	}
	res := make(chan result, 1)
	go func() {
		var o map[string]any
		err := update(&o)
		res <- result{o, err}
	}()
	r.awaitFailpoint(fp)
	r.spawn("")
	got := <-res
	return got.out, got.err
}

func TestWorkerCrashDuringPublish(t *testing.T) {
	r := newCrashRig(t)
	id, s, ep := r.readySandbox("a\nb\nc\n")

	// A publish is one exactly-once daemon call (publish_workspace_session by
	// its txid): the worker dies after the daemon committed and answered,
	// before Temporal recorded it; the retry gets the same answer. A plain
	// publish calls from a local activity (the update is not even accepted
	// in the history yet: Temporal hands it to the next worker), a verified
	// one from an activity.
	for i, tc := range []struct {
		fp     string
		verify *string
	}{{"CallDaemonHere:publish_workspace_session", nil}, {"CallDaemon:publish_workspace_session", ptr("grep -c step f.txt")}} {
		fp := tc.fp
		name := fp
		if tc.verify != nil {
			name += "/verified"
		}
		t.Run(name, func(t *testing.T) {
			s.t = t
			var sess map[string]any
			require.NoError(t, r.update(id, workflows.UpdateCreateSession, &sess, workflows.CreateSessionRequest{}))
			wsID := sess["workspace_session_id"].(string)
			out := s.daemon(id, ep, "exec_command", map[string]any{"cmd": fmt.Sprintf("echo step-%d >> f.txt", i), "workspace_session_id": wsID, "yield_time_ms": 30000})
			require.Equal(t, "ok", out["status"])
			before := len(s.daemon(id, ep, "layerstack_history", map[string]any{})["publishes"].([]any))

			out, err := r.crashDuring(fp, func(o *map[string]any) error {
				return r.update(id, workflows.UpdatePublish, o, workflows.PublishRequest{WorkspaceSessionID: wsID, Verify: tc.verify})
			})
			require.NoError(t, err)
			require.Equal(t, true, out["destroyed"], "%v", out)

			hist := s.daemon(id, ep, "layerstack_history", map[string]any{})["publishes"].([]any)
			require.Len(t, hist, before+1, "exactly one new layer")
			content := s.daemon(id, ep, "file_read", map[string]any{"path": "f.txt", "keep_final_newline": true})["content"].(string)
			require.Equal(t, 1, strings.Count(content, fmt.Sprintf("step-%d\n", i)), content)
		})
	}
	s.t = t
	var final workflows.SandboxState
	require.NoError(t, r.update(id, workflows.UpdateDestroy, &final))
	require.Equal(t, workflows.PhaseStopped, final.Phase)
}

// A session create calls the daemon from a local activity: the worker
// dies after the daemon made the session and answered, before Temporal
// heard of it. Temporal hands the update to the next worker, whose call
// under the same request id answers the same session: one session, the
// one the caller is told of.
func TestWorkerCrashDuringSessionCreate(t *testing.T) {
	r := newCrashRig(t)
	id, s, ep := r.readySandbox("a\n")
	sessions := func() []any {
		return s.daemon(id, ep, "list_workspace_sessions", map[string]any{})["workspace_sessions"].([]any)
	}
	before := len(sessions())

	const fp = "CallDaemonHere:create_workspace_session"
	out, err := r.crashDuring(fp, func(o *map[string]any) error {
		return r.update(id, workflows.UpdateCreateSession, o, workflows.CreateSessionRequest{Agent: "crash"})
	})
	require.NoError(t, err)
	after := sessions()
	require.Len(t, after, before+1, "one session for one create: %v", after)
	var ids []string
	for _, x := range after {
		ids = append(ids, x.(map[string]any)["workspace_session_id"].(string))
	}
	require.Contains(t, ids, out["workspace_session_id"], "the caller is told of the session that exists")
	var final workflows.SandboxState
	require.NoError(t, r.update(id, workflows.UpdateDestroy, &final))
}

// The worker dies right after the daemon destroyed the session, before
// Temporal recorded it: the retry finds the session gone, which is what
// the destroy asked, and answers destroyed; the sandbox forgets it.
func TestWorkerCrashDuringSessionDestroy(t *testing.T) {
	r := newCrashRig(t)
	id, s, ep := r.readySandbox("a\n")
	var created map[string]any
	require.NoError(t, r.update(id, workflows.UpdateCreateSession, &created, workflows.CreateSessionRequest{Agent: "crash"}))
	ws := created["workspace_session_id"].(string)

	const fp = "CallDaemonHere:destroy_workspace_session"
	out, err := r.crashDuring(fp, func(o *map[string]any) error {
		return r.update(id, workflows.UpdateDestroySession, o, workflows.SessionRequest{WorkspaceSessionID: ws})
	})
	require.NoError(t, err)
	require.Equal(t, true, out["destroyed"], "%v", out)
	require.Equal(t, ws, out["workspace_session_id"])
	for _, x := range s.daemon(id, ep, "list_workspace_sessions", map[string]any{})["workspace_sessions"].([]any) {
		require.NotEqual(t, ws, x.(map[string]any)["workspace_session_id"], "the daemon has no such session")
	}
	v, err := r.c.QueryWorkflow(context.Background(), workflows.SandboxWorkflowID(id), "", workflows.QueryState)
	require.NoError(t, err)
	var st workflows.SandboxState
	require.NoError(t, v.Get(&st))
	require.NotContains(t, st.Sessions, ws, "the sandbox forgot it")
	require.NoError(t, r.update(id, workflows.UpdateDestroy, &st))
}

func TestWorkerCrashDuringCreate(t *testing.T) {
	r := newCrashRig(t)
	for _, fp := range []string{"CreateContainer", "StartContainer", "ImportWorkspace"} {
		t.Run(fp, func(t *testing.T) {
			id := "crash-" + randHex(5)
			t.Cleanup(func() { _ = r.acts().RemoveSandbox(context.Background(), id) })
			r.kill()
			r.spawn(fp)
			r.startSandbox(id, t.TempDir())
			r.awaitFailpoint(fp)
			r.spawn("")
			var st workflows.SandboxState
			require.NoError(t, r.update(id, workflows.UpdateWaitReady, &st))
			require.Equal(t, workflows.PhaseReady, st.Phase)
			require.NoError(t, r.update(id, workflows.UpdateDestroy, &st))
			left, err := r.acts().ListLeftovers(context.Background())
			require.NoError(t, err)
			for _, l := range left {
				require.NotEqual(t, id, l.SandboxID, "leaked %+v", l)
			}
		})
	}
}

type quietLogger struct{}

func (quietLogger) Debug(string, ...interface{}) {}
func (quietLogger) Info(string, ...interface{})  {}
func (quietLogger) Warn(string, ...interface{})  {}
func (quietLogger) Error(string, ...interface{}) {}

var _ = json.Marshal

func ptr[T any](v T) *T { return &v }

// TestDaemonCrashMidCommit kills the daemon inside the layer store's commit
// (through the store's failpoint file), once letting the supervisor restart
// the daemon and once restarting the whole container (which also moves the
// daemon to a new host port): the publish completes exactly once. At
// after-sync the daemon's own record of the publish, written with the
// commit, is on disk and the commit is not: the boot finds it void.
func TestDaemonCrashMidCommit(t *testing.T) {
	s := startStack(t)
	id, st := s.createWith("a\n")
	name := workflows.ContainerName(id)
	for i, tc := range []struct {
		fp               string
		restartContainer bool
	}{{"after-rename", false}, {"after-sync", false}, {"after-manifest", false}, {"after-manifest", true}} {
		t.Run(fmt.Sprintf("%s/container-restart=%v", tc.fp, tc.restartContainer), func(t *testing.T) {
			s.t = t
			ep := s.endpoint(id, st)
			var sess map[string]any
			require.NoError(t, s.update(id, workflows.UpdateCreateSession, &sess, workflows.CreateSessionRequest{}))
			wsID := sess["workspace_session_id"].(string)
			out := s.daemon(id, ep, "exec_command", map[string]any{"cmd": fmt.Sprintf("echo crash-%d >> f.txt", i), "workspace_session_id": wsID, "yield_time_ms": 30000})
			require.Equal(t, "ok", out["status"])
			before := len(s.daemon(id, ep, "layerstack_history", map[string]any{})["publishes"].([]any))
			dockerExec(t, name, "sh", "-c", "echo "+tc.fp+" > /eos/layerstack/.failpoints")

			res := make(chan error, 1)
			go func() {
				var o map[string]any
				res <- s.update(id, workflows.UpdatePublish, &o, workflows.PublishRequest{WorkspaceSessionID: wsID})
			}()
			if tc.restartContainer {
				require.Eventually(t, func() bool {
					return exec.Command("docker", "exec", name, "test", "-e", "/eos/layerstack/.failpoints").Run() != nil
				}, time.Minute, 50*time.Millisecond, "the failpoint never fired")
				out, err := exec.Command("docker", "restart", "-t", "2", name).CombinedOutput()
				require.NoError(t, err, "%s", out)
			}
			require.NoError(t, <-res)
			ep = s.endpoint(id, st)
			hist := s.daemon(id, ep, "layerstack_history", map[string]any{})["publishes"].([]any)
			require.Len(t, hist, before+1, "exactly one new layer")
			content := s.daemon(id, ep, "file_read", map[string]any{"path": "f.txt", "keep_final_newline": true})["content"].(string)
			require.Equal(t, 1, strings.Count(content, fmt.Sprintf("crash-%d\n", i)), content)
		})
	}
}

// endpoint returns the daemon's current endpoint (a container restart moves it).
func (s *stack) endpoint(id string, st *workflows.SandboxState) api.Endpoint {
	r, err := s.acts.Inspect(context.Background(), id)
	require.NoError(s.t, err)
	require.True(s.t, r.Exists)
	return r.Container.Daemon
}

func dockerExec(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command("docker", append([]string{"exec", name}, args...)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// TestWorkerCrashDuringHandOver: the worker dies in a sandbox run's
// hand-over to the next (its Pass activity done, Temporal not told). The
// agents' updates meanwhile are refused and sent again; a fresh worker
// finishes the hand-over, and every update is answered, once: each session
// created was destroyed and none is left in the workflow's record.
func TestWorkerCrashDuringHandOver(t *testing.T) {
	r := newCrashRig(t)
	id, s, ep := r.readySandbox("a\n")
	r.kill()
	r.spawn(workflows.ActPass)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan error, 1)
	cycles := 0
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			var info api.SessionInfo
			if err := lifecycle.Update(ctx, r.c, id, workflows.UpdateCreateSession, "", &info, workflows.CreateSessionRequest{}); err != nil {
				done <- fmt.Errorf("create %d: %w", cycles, err)
				return
			}
			if err := lifecycle.Update(ctx, r.c, id, workflows.UpdateDestroySession, "", nil, workflows.SessionRequest{WorkspaceSessionID: info.WorkspaceSessionID}); err != nil {
				done <- fmt.Errorf("destroy %s: %w", info.WorkspaceSessionID, err)
				return
			}
			cycles++
		}
	}()
	r.awaitFailpoint(workflows.ActPass)
	r.spawn("")
	var st workflows.SandboxState
	require.Eventually(t, func() bool {
		v, err := r.c.QueryWorkflow(ctx, workflows.SandboxWorkflowID(id), "", workflows.QueryState)
		return err == nil && v.Get(&st) == nil && st.Runs >= 2
	}, 2*time.Minute, 50*time.Millisecond, "the next run started")
	time.Sleep(time.Second) // more updates on the next run
	close(stop)
	require.NoError(t, <-done)
	v, err := r.c.QueryWorkflow(ctx, workflows.SandboxWorkflowID(id), "", workflows.QueryState)
	require.NoError(t, err)
	st = workflows.SandboxState{} // decoding into the polled one would keep its sessions
	require.NoError(t, v.Get(&st))
	require.Empty(t, st.Sessions, "every session created was destroyed, once")
	require.Empty(t, s.daemon(id, ep, "list_workspace_sessions", map[string]any{})["workspace_sessions"], "and the daemon has none either")
	t.Logf("%d create/destroy cycles over %d runs", cycles, st.Runs)
	var final workflows.SandboxState
	require.NoError(t, r.update(id, workflows.UpdateDestroy, &final))
	require.Equal(t, workflows.PhaseStopped, final.Phase)
}

// TestFailedDestroyThroughTheWorkflow: a destroy the daemon cannot finish
// (the failpoints runtime-kill and runtime-destroy: the session's
// processes cannot be ended) is answered through the sandbox's workflow as
// operation_failed with the session finalize_failed, and the workflow keeps
// the session: before, the daemon dropped it, and a retried destroy's
// not_found was answered destroyed with its processes still running. The
// retry through the workflow ends them and the workflow forgets it.
func TestFailedDestroyThroughTheWorkflow(t *testing.T) {
	s := startStack(t)
	id, st := s.createWith("a\n")
	name := workflows.ContainerName(id)
	var sess map[string]any
	require.NoError(t, s.update(id, workflows.UpdateCreateSession, &sess, workflows.CreateSessionRequest{}))
	wsID := sess["workspace_session_id"].(string)
	out := s.daemon(id, st.Container.Daemon, "exec_command", map[string]any{"workspace_session_id": wsID, "yield_time_ms": 30000,
		"cmd": "setsid sleep 4711 </dev/null >/dev/null 2>&1 & pid=$!; for i in $(seq 1000); do [ \"$(tr '\\0' ' ' </proc/$pid/cmdline 2>/dev/null)\" = 'sleep 4711 ' ] && exit 0; sleep 0.01; done; exit 1"})
	require.Equal(t, "ok", out["status"], "%v", out)
	sleeping := func() bool {
		out, err := exec.Command("docker", "exec", name, "ps", "-o", "args").CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.Contains(string(out), "sleep 4711")
	}
	require.True(t, sleeping())

	dockerExec(t, name, "sh", "-c", "printf 'error:runtime-kill\\nerror:runtime-destroy\\n' > /eos/layerstack/.failpoints")
	err := s.update(id, workflows.UpdateDestroySession, nil, workflows.SessionRequest{WorkspaceSessionID: wsID})
	ae, ok := apperr.From(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, api.KindOperationFailed, ae.Kind, "%v", err)
	require.Equal(t, "finalize_failed", ae.Details["session_state"], "%v", ae.Details)
	require.True(t, sleeping(), "the failed destroy left the session's processes running")
	require.Contains(t, s.state(id).Sessions, wsID, "the workflow keeps the session whose destroy failed")

	var res api.SessionDestroyed
	require.NoError(t, s.update(id, workflows.UpdateDestroySession, &res, workflows.SessionRequest{WorkspaceSessionID: wsID}))
	require.True(t, res.Destroyed)
	require.Eventually(t, func() bool { return !sleeping() }, 10*time.Second, 50*time.Millisecond, "the retried destroy ended the session's processes")
	require.NotContains(t, s.state(id).Sessions, wsID)
}
