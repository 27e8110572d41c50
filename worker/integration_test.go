package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// stack is the lifecycle service on the embedded Temporal with real Docker.
type stack struct {
	t      *testing.T
	svc    *Service
	acts   *activities.Activities
	secret []byte
	docker activities.Docker
}

func startStack(t *testing.T) *stack {
	t.Helper()
	s := startStackFor(t)
	s.t = t
	return s
}

// startStackFor runs the lifecycle service on an embedded Temporal.
func startStackFor(tb testing.TB) *stack {
	tb.Helper()
	testenv.RequireDocker(tb)
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	dc, err := activities.NewDockerClient()
	require.NoError(tb, err)
	acts := activities.New(activities.Config{DaemonBinary: testenv.DaemonBinary(tb), SeccompProfile: testenv.SeccompProfile(tb),
		Secret: secret, WorkerID: "test", HostPaths: testenv.HostPaths(tb)}, dc)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := Start(context.Background(), Options{StateDir: tb.TempDir(), EmbeddedAddress: "127.0.0.1:0", UIAddress: "off",
		Secret: secret, Activities: acts, HostQueue: "eos-host-test-" + randHex(4), Logger: log})
	require.NoError(tb, err)
	tb.Cleanup(svc.Stop)
	return &stack{svc: svc, acts: acts, secret: secret, docker: dc}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// create starts a sandbox workflow and waits until it is ready.
func (s *stack) create(workspace string) (string, *workflows.SandboxState) {
	id := "it-" + randHex(6)
	s.t.Cleanup(func() { _ = s.acts.RemoveSandbox(context.Background(), id) })
	ctx := context.Background()
	_, err := s.svc.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
		workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue,
			Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: workspace}})
	require.NoError(s.t, err)
	var st workflows.SandboxState
	require.NoError(s.t, s.update(id, workflows.UpdateWaitReady, &st))
	return id, &st
}

// createWith creates a sandbox of a workspace holding f.txt with content.
func (s *stack) createWith(content string) (string, *workflows.SandboxState) {
	s.t.Helper()
	ws := s.t.TempDir()
	require.NoError(s.t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte(content), 0o644))
	return s.create(ws)
}

func (s *stack) update(id, name string, out any, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h, err := s.svc.Client.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: workflows.SandboxWorkflowID(id),
		UpdateName: name, Args: args, WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		return err
	}
	return h.Get(ctx, out)
}

// state is sandbox id's workflow state, as its query answers it.
func (s *stack) state(id string) workflows.SandboxState {
	s.t.Helper()
	v, err := s.svc.Client.QueryWorkflow(context.Background(), workflows.SandboxWorkflowID(id), "", workflows.QueryState)
	require.NoError(s.t, err)
	var st workflows.SandboxState
	require.NoError(s.t, v.Get(&st))
	return st
}

// daemon calls a runtime op directly, as the gateway will.
func (s *stack) daemon(id string, ep api.Endpoint, op string, args any) map[string]any {
	s.t.Helper()
	return s.daemonTB(s.t, id, ep, op, args)
}

func (s *stack) daemonTB(tb testing.TB, id string, ep api.Endpoint, op string, args any) map[string]any {
	tb.Helper()
	body, _ := json.Marshal(args)
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s:%d/rpc/%s", ep.Host, ep.Port, op), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+daemonclient.Token(s.secret, id))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(tb, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(tb, json.NewDecoder(resp.Body).Decode(&out))
	require.Equal(tb, 200, resp.StatusCode, "%s: %v", op, out)
	return out
}

func TestLifecycleThroughTemporal(t *testing.T) {
	s := startStack(t)
	ws := t.TempDir()
	var b strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte(b.String()), 0o644))
	id, st := s.create(ws)
	require.Equal(t, workflows.PhaseReady, st.Phase)
	ep := st.Container.Daemon

	var sess []string
	for i := 0; i < 3; i++ {
		var out map[string]any
		require.NoError(t, s.update(id, workflows.UpdateCreateSession, &out, workflows.CreateSessionRequest{Agent: fmt.Sprintf("agent-%d", i)}))
		sess = append(sess, out["workspace_session_id"].(string))
	}
	for i, script := range []string{
		"sed -i 's/^line 2$/LINE TWO/' f.txt", "sed -i 's/^line 9$/LINE NINE/' f.txt", "sed -i 's/^line 2$/line deux/' f.txt",
	} {
		out := s.daemon(id, ep, "exec_command", map[string]any{"cmd": script, "workspace_session_id": sess[i], "yield_time_ms": 30000})
		require.Equal(t, "ok", out["status"])
	}
	var pub map[string]any
	require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[0]}))
	require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[1]}))
	read := s.daemon(id, ep, "file_read", map[string]any{"path": "f.txt", "keep_final_newline": true})
	require.Contains(t, read["content"], "LINE TWO\n")
	require.Contains(t, read["content"], "LINE NINE\n")

	err := s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[2]})
	var app *temporal.ApplicationError
	require.True(t, errors.As(err, &app), "a conflict, got %v", err)
	var det map[string]any
	require.NoError(t, app.Details(&det))
	conflicts := det["details"].(map[string]any)["conflicts"].([]any)
	require.Equal(t, "f.txt", conflicts[0].(map[string]any)["path"])
	require.Equal(t, read["content"], s.daemon(id, ep, "file_read", map[string]any{"path": "f.txt", "keep_final_newline": true})["content"], "nothing changed")

	var final workflows.SandboxState
	require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
	require.Equal(t, workflows.PhaseStopped, final.Phase)
	left, err := s.acts.ListLeftovers(context.Background())
	require.NoError(t, err)
	for _, l := range left {
		require.NotEqual(t, id, l.SandboxID, "leftover %+v", l)
	}
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	s := startStack(t)
	id := "it-" + randHex(6)
	ctx := context.Background()
	run, err := s.svc.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
		workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue,
			Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: "/nonexistent/workspace"}})
	require.NoError(t, err)
	var res workflows.SandboxResult
	require.Error(t, run.Get(ctx, &res))
	left, err := s.acts.ListLeftovers(ctx)
	require.NoError(t, err)
	for _, l := range left {
		require.NotEqual(t, id, l.SandboxID, "leftover %+v", l)
	}
	// A missing image fails fast with its own error type.
	run, err = s.svc.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id + "-img"), TaskQueue: workflows.TaskQueue},
		workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue,
			Spec: workflows.SandboxSpec{SandboxID: id + "-img", Image: "eos-no-such-image:404", WorkspaceRoot: t.TempDir()}})
	require.NoError(t, err)
	err = run.Get(ctx, &res)
	var app *temporal.ApplicationError
	require.True(t, errors.As(err, &app), "%v", err)
	require.Equal(t, api.KindInvalidRequest, app.Type())
	require.Contains(t, app.Error(), "is not present on this Docker host")
}

// TestCountSandboxesShareOneBase: three sandboxes over one shared base
// volume; each works independently; the base volume goes with the last.
func TestCountSandboxesShareOneBase(t *testing.T) {
	s := startStack(t)
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte("shared\n"), 0o644))
	ids := []string{"grp-" + randHex(5), "grp-" + randHex(5), "grp-" + randHex(5)}
	for _, id := range ids {
		id := id
		t.Cleanup(func() { _ = s.acts.RemoveSandbox(context.Background(), id) })
	}
	states, err := s.svc.CreateSandboxes(context.Background(), workflows.SandboxSpec{Image: testenv.Images[0], WorkspaceRoot: ws}, ids, 0)
	require.NoError(t, err)
	require.Len(t, states, 3)
	for i, st := range states {
		require.Equal(t, states[0].BaseID, st.BaseID, "one base for all")
		out := s.daemon(ids[i], st.Container.Daemon, "exec_command", map[string]any{"cmd": fmt.Sprintf("echo sandbox-%d >> f.txt", i), "yield_time_ms": 30000})
		require.NotContains(t, out, "publish_rejected", "a clean implicit publish carries no publish_rejected key")
	}
	for i, st := range states {
		got := s.daemon(ids[i], st.Container.Daemon, "file_read", map[string]any{"path": "f.txt", "keep_final_newline": true})["content"]
		require.Equal(t, fmt.Sprintf("shared\nsandbox-%d\n", i), got, "each sandbox has its own history over the shared base")
	}
	base := workflows.BaseVolumeName(ids[0])
	for i, id := range ids {
		var st workflows.SandboxState
		require.NoError(t, s.update(id, workflows.UpdateDestroy, &st))
		err := exec.Command("docker", "volume", "inspect", base).Run()
		if i < len(ids)-1 {
			require.NoError(t, err, "the shared base stays while a sandbox mounts it")
		} else {
			require.Error(t, err, "the last sandbox takes the shared base with it")
		}
	}
}

// TestReconcilerDeletesNothing: a sandbox of this deployment without a
// running workflow is an orphan — its container stopped, its volume kept,
// listed; a sandbox of another deployment (other Temporal cluster) is not
// touched at all; a running sandbox whose container vanished is failed,
// and its volume — the work — stays.
func TestReconcilerDeletesNothing(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	orphan, foreign := "orph-"+randHex(5), "forn-"+randHex(5)
	t.Cleanup(func() { _ = s.acts.RemoveSandbox(ctx, orphan); _ = s.acts.RemoveSandbox(ctx, foreign) })
	for _, id := range []string{orphan, foreign} {
		acts := s.acts
		if id == foreign {
			acts = activities.New(activities.Config{DaemonBinary: testenv.DaemonBinary(t), SeccompProfile: testenv.SeccompProfile(t),
				Secret: []byte("another deployment"), WorkerID: "test"}, s.docker)
			activities.SetOwner(acts, "another-cluster", "default")
		}
		spec := workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: t.TempDir()}
		_, err := acts.CreateVolume(ctx, spec)
		require.NoError(t, err)
		_, err = acts.CreateContainer(ctx, spec)
		require.NoError(t, err)
		_, err = acts.StartContainer(ctx, id)
		require.NoError(t, err)
	}

	lost, _ := s.create(t.TempDir())
	t.Cleanup(func() { _ = s.acts.RemoveSandbox(ctx, lost) })
	out, err := exec.Command("docker", "rm", "-f", workflows.ContainerName(lost)).CombinedOutput()
	require.NoError(t, err, "%s", out)

	rep, err := s.svc.Reconcile(ctx, s.acts)
	require.NoError(t, err)
	ids := func(os []workflows.SandboxObjects) map[string]workflows.SandboxObjects {
		m := map[string]workflows.SandboxObjects{}
		for _, o := range os {
			m[o.SandboxID] = o
		}
		return m
	}
	orphans, foreigns := ids(rep.Orphans), ids(rep.Foreign)
	require.Contains(t, orphans, orphan, "%+v", rep)
	require.Equal(t, workflows.VolumeName(orphan), orphans[orphan].Volume)
	require.Equal(t, testenv.Images[0], orphans[orphan].Image)
	require.Contains(t, foreigns, foreign, "%+v", rep)
	require.NotContains(t, orphans, foreign)
	require.Equal(t, []string{lost}, rep.Lost)

	state := func(id string) string {
		out, err := exec.Command("docker", "inspect", "-f", "{{.State.Status}}", workflows.ContainerName(id)).CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	require.Equal(t, "exited", state(orphan), "the orphan is stopped")
	require.Equal(t, "running", state(foreign), "another deployment's sandbox is not touched")

	run := s.svc.Client.GetWorkflow(ctx, workflows.SandboxWorkflowID(lost), "")
	var res workflows.SandboxResult
	require.NoError(t, run.Get(ctx, &res))
	require.Equal(t, workflows.PhaseFailed, res.Phase)
	for _, id := range []string{orphan, foreign, lost} {
		require.NoError(t, exec.Command("docker", "volume", "inspect", workflows.VolumeName(id)).Run(), "the volume of %s is kept", id)
	}
}
