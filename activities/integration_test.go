package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// These tests drive the real Docker Engine and the real sandbox-daemon
// binary (scripts/ensure-docker.sh, scripts/build-test-images.sh).

const testImage = "eos-test-busybox:1"

var (
	daemonOnce sync.Once
	daemonBin  string
	daemonDir  string
	daemonErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if daemonDir != "" {
		os.RemoveAll(daemonDir)
	}
	os.Exit(code)
}

// testDaemonBinary builds cmd/sandbox-daemon statically with libseccomp (as
// the daemon's end-to-end harness and `make daemon` do), once per test run. EOS_TEST_DAEMON_BINARY
// names a prebuilt one instead.
func testDaemonBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("EOS_TEST_DAEMON_BINARY"); p != "" {
		return p
	}
	daemonOnce.Do(func() {
		daemonDir, daemonErr = os.MkdirTemp("", "eos-activities-daemon-")
		if daemonErr != nil {
			return
		}
		daemonBin = filepath.Join(daemonDir, "sandbox-daemon")
		cmd := exec.Command("go", "build", "-tags", "seccomp osusergo netgo", "-ldflags", "-linkmode external -extldflags -static",
			"-o", daemonBin, "./cmd/sandbox-daemon")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			daemonErr = fmt.Errorf("static build of sandbox-daemon: %v\n%s", err, out)
		}
	})
	require.NoError(t, daemonErr)
	return daemonBin
}

// requireDockerEngine fails (never skips) when Docker or the test image is
// missing, saying how to get them.
func requireDockerEngine(t *testing.T) *client.Client {
	t.Helper()
	cli, err := NewDockerClient()
	require.NoError(t, err, "Docker client")
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		t.Fatalf("Docker Engine not reachable (%v): these tests need a running Docker Engine (run scripts/ensure-docker.sh)", err)
	}
	if _, err := cli.ImageInspect(ctx, testImage); err != nil {
		if cerrdefs.IsNotFound(err) {
			t.Fatalf("image %s is missing: run scripts/build-test-images.sh", testImage)
		}
		t.Fatalf("inspect image %s: %v", testImage, err)
	}
	return cli
}

// newDockerActivities builds activities over the real engine for one test
// sandbox, labelled eos.test=activities, removed when the test ends.
func newDockerActivities(t *testing.T) (*Activities, *client.Client, workflows.SandboxSpec) {
	t.Helper()
	return newDockerActivitiesWith(t, testDaemonBinary(t))
}

// newDockerActivitiesWith is newDockerActivities with daemonBin as the
// daemon build.
func newDockerActivitiesWith(t *testing.T, daemonBin string) (*Activities, *client.Client, workflows.SandboxSpec) {
	t.Helper()
	cli := requireDockerEngine(t)
	seccomp, err := os.ReadFile(filepath.Join("..", "sandboxinit", "runtime", "seccomp.json"))
	require.NoError(t, err)
	id := "acttest-" + randHex(4)
	acts := New(Config{
		DaemonBinary:   daemonBin,
		SeccompProfile: string(seccomp),
		Secret:         []byte(randHex(32)),
		WorkerID:       "acttest-worker-" + id, // ListLeftovers sees only this test's objects
		HostPaths:      testHostPaths(t),
	}, cli)
	spec := workflows.SandboxSpec{SandboxID: id, Image: testImage, Labels: map[string]string{"eos.test": "activities"},
		Profile: workflows.ResourceProfile{MemoryBytes: 1 << 30, CPUs: 2, PidsLimit: 4096}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if t.Failed() {
			if rc, err := cli.ContainerLogs(ctx, workflows.ContainerName(id), container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "60"}); err == nil {
				var out safeBuffer
				_, _ = stdcopy.StdCopy(&out, &out, rc)
				rc.Close()
				t.Logf("daemon logs of %s:\n%s", workflows.ContainerName(id), out.String())
			}
		}
		if err := acts.RemoveSandbox(ctx, id); err != nil {
			t.Errorf("cleanup of sandbox %s: %v", id, err)
		}
	})
	return acts, cli, spec
}

type safeBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

// TestSandboxLifecycleOnDocker runs the activities of a sandbox's life in
// order, without Temporal, against the real engine and daemon.
func TestSandboxLifecycleOnDocker(t *testing.T) {
	acts, _, spec := newDockerActivities(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := spec.SandboxID

	// A workspace with files, a symlink and a FIFO.
	ws := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "src"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("alpha\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "del.txt"), []byte("to be deleted\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "src", "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755))
	require.NoError(t, os.Symlink("src/run.sh", filepath.Join(ws, "run-link")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(ws, "pipe"), 0o644))
	spec.WorkspaceRoot = ws

	require.NoError(t, acts.CheckImage(ctx, spec.Image))
	vol, err := acts.CreateVolume(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, workflows.VolumeName(id), vol)
	info, err := acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	require.False(t, info.Adopted)
	require.Equal(t, "created", info.State)

	rep, err := acts.CopyWorkspace(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, workflows.CopyReport{Files: 3, Dirs: 2, Symlinks: 1, Bytes: 6 + 14 + 19, Skipped: 1, SkippedPaths: []string{"pipe"}}, rep)

	started, err := acts.StartContainer(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", started.Daemon.Host)
	require.NotZero(t, started.Daemon.Port)
	readyCtx, readyCancel := context.WithTimeout(ctx, 60*time.Second)
	defer readyCancel()
	require.NoError(t, acts.WaitReady(readyCtx, id, started.Daemon))

	call := func(op string, args any) map[string]any {
		t.Helper()
		raw, err := json.Marshal(args)
		require.NoError(t, err)
		res, err := acts.CallDaemon(ctx, workflows.DaemonCall{SandboxID: id, Daemon: started.Daemon, Op: op, Args: raw, RequestID: "acttest-" + op})
		require.NoError(t, err, "%s", op)
		var out map[string]any
		require.NoError(t, json.Unmarshal(res, &out))
		return out
	}
	base := call("init_base", map[string]any{"source_dir": ImportDir, "remove_source": true})
	require.NotEmpty(t, base["base_id"])
	again := call("init_base", map[string]any{"source_dir": ImportDir, "remove_source": true})
	require.Equal(t, true, again["already_initialized"])

	sess := call("create_workspace_session", map[string]any{})["workspace_session_id"].(string)
	out := call("exec_command", map[string]any{"workspace_session_id": sess, "yield_time_ms": 60000,
		"cmd": "cat a.txt && test -L run-link && test ! -e pipe && echo changed > a.txt && echo hi > new.txt && rm del.txt && ln -s new.txt new-link"})
	require.Equal(t, "ok", out["status"], "%v", out)
	require.EqualValues(t, 0, out["exit_code"], "%v", out)
	require.Contains(t, out["output"], "alpha")
	call("publish_workspace_session", map[string]any{"workspace_session_id": sess})

	// A daemon error keeps its envelope through the error mapping.
	_, err = acts.CallDaemon(ctx, workflows.DaemonCall{SandboxID: id, Daemon: started.Daemon, Op: "file_read", Args: json.RawMessage(`{"path":"missing.txt"}`)})
	requireAppError(t, err, api.KindNotFound, true)
	de, ok := apperr.From(err)
	require.True(t, ok)
	require.Equal(t, "not_found", de.Kind, "%+v", de)

	// Export into a copy of the original tree: the deletion applies.
	dest := filepath.Join(t.TempDir(), "export")
	require.NoError(t, os.MkdirAll(dest, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dest, "a.txt"), []byte("alpha\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dest, "del.txt"), []byte("to be deleted\n"), 0o644))
	res, err := acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: id, Daemon: started.Daemon, Dest: dest})
	require.NoError(t, err)
	require.Equal(t, "dir", res.Format)
	require.Len(t, res.LayersExported, 1, "%+v", res)
	require.GreaterOrEqual(t, res.ManifestVersion, int64(2))
	require.Equal(t, 2, *res.FilesWritten, "%+v", res)
	require.Equal(t, 1, *res.SymlinksWritten, "%+v", res)
	require.Equal(t, 1, *res.DeletesApplied, "%+v", res)
	b, err := os.ReadFile(filepath.Join(dest, "a.txt"))
	require.NoError(t, err)
	require.Equal(t, "changed\n", string(b))
	b, err = os.ReadFile(filepath.Join(dest, "new.txt"))
	require.NoError(t, err)
	require.Equal(t, "hi\n", string(b))
	target, err := os.Readlink(filepath.Join(dest, "new-link"))
	require.NoError(t, err)
	require.Equal(t, "new.txt", target)
	require.NoFileExists(t, filepath.Join(dest, "del.txt"))

	tarFile := filepath.Join(t.TempDir(), "changes.tar.zst")
	res, err = acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: id, Daemon: started.Daemon, Dest: tarFile, Format: "tar-zst"})
	require.NoError(t, err)
	require.Equal(t, 2, *res.FilesWritten, "%+v", res)
	require.Equal(t, 1, *res.SymlinksWritten, "%+v", res)
	require.Equal(t, 1, *res.WhiteoutsEmitted, "%+v", res)
	fi, err := os.Stat(tarFile)
	require.NoError(t, err)
	require.Equal(t, fi.Size(), res.BytesWritten)

	// Creating again adopts the running container.
	adopted, err := acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	require.True(t, adopted.Adopted)
	require.Equal(t, info.ContainerID, adopted.ContainerID)
	require.Equal(t, started.Daemon, adopted.Daemon)

	st, err := acts.Stats(ctx, id)
	require.NoError(t, err)
	require.NotZero(t, st.MemoryBytes)
	require.NotZero(t, st.Pids)
	require.EqualValues(t, 1<<30, st.MemoryLimit)

	left, err := acts.ListLeftovers(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []Leftover{
		{Kind: "container", Name: workflows.ContainerName(id), SandboxID: id},
		{Kind: "volume", Name: workflows.VolumeName(id), SandboxID: id},
		{Kind: "network", Name: networkName(id), SandboxID: id},
	}, left)

	require.NoError(t, acts.StopContainer(ctx, id))
	require.NoError(t, acts.RemoveSandbox(ctx, id))
	require.NoError(t, acts.RemoveSandbox(ctx, id))
	ins, err := acts.Inspect(ctx, id)
	require.NoError(t, err)
	require.False(t, ins.Exists)
	left, err = acts.ListLeftovers(ctx)
	require.NoError(t, err)
	require.Empty(t, left)
}

// TestActivitiesRegisterWithTemporal runs activities through the SDK's
// activity test environment: registration of the whole struct works, and
// error types and daemon envelopes survive Temporal's error conversion.
func TestActivitiesRegisterWithTemporal(t *testing.T) {
	acts, _, spec := newDockerActivities(t)
	suite := &testsuite.WorkflowTestSuite{}
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler))) // the expected failures would be logged as errors
	env := suite.NewTestActivityEnvironment()
	env.SetTestTimeout(90 * time.Second)
	env.RegisterActivity(acts)

	_, err := env.ExecuteActivity(acts.CheckImage, testImage)
	require.NoError(t, err)

	_, err = env.ExecuteActivity(acts.CheckImage, "eos-test-missing:0")
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%T: %v", err, err)
	require.Equal(t, api.KindInvalidRequest, appErr.Type())
	require.True(t, appErr.NonRetryable())
	require.Contains(t, appErr.Error(), "no pull is attempted")

	val, err := env.ExecuteActivity(acts.CreateContainer, spec)
	require.NoError(t, err)
	var info workflows.ContainerInfo
	require.NoError(t, val.Get(&info))
	require.Equal(t, workflows.ContainerName(spec.SandboxID), info.Name)
	val, err = env.ExecuteActivity(acts.StartContainer, spec.SandboxID)
	require.NoError(t, err)
	require.NoError(t, val.Get(&info))
	_, err = env.ExecuteActivity(acts.WaitReady, spec.SandboxID, info.Daemon)
	require.NoError(t, err)
	val, err = env.ExecuteActivity(acts.Inspect, spec.SandboxID)
	require.NoError(t, err)
	var ins InspectResult
	require.NoError(t, val.Get(&ins))
	require.True(t, ins.Exists)
	require.Equal(t, "running", ins.Container.State)

	// The daemon's envelope is the error's detail on the workflow side.
	_, err = env.ExecuteActivity(acts.CallDaemon, workflows.DaemonCall{SandboxID: spec.SandboxID, Daemon: info.Daemon, Op: "no_such_op"})
	require.True(t, errors.As(err, &appErr), "%T: %v", err, err)
	require.Equal(t, api.KindUnknownOp, appErr.Type())
	de, ok := apperr.From(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "unknown_op", de.Kind)
	require.Equal(t, "no_such_op", de.Details["op"])
}

// A daemon build the container cannot keep running (here a static
// program that exits at once, as a binary the image cannot execute does)
// puts the container in Docker's restart loop: WaitReady says so, with the
// program's own words, long before its deadline (or StartContainer does,
// when it finds the container between two restarts).
func TestWaitReadyReportsADaemonThatCannotStart(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(`package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Println("not a daemon: exiting")
	os.Exit(3)
}
`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module notadaemon\n\ngo 1.21\n"), 0o644))
	bin := filepath.Join(dir, "sandbox-daemon")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	acts, _, spec := newDockerActivitiesWith(t, bin)
	requireDaemonCannotStart(t, acts, spec, "keeps exiting (exit code 3", "not a daemon: exiting")
}

// requireDaemonCannotStart creates and starts spec's container and
// requires the start, or the wait for its daemon, to fail as a daemon that
// cannot start (operation_failed, not retried) saying each of wants,
// before the 3-minute deadline.
func requireDaemonCannotStart(t *testing.T, acts *Activities, spec workflows.SandboxSpec, wants ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	// The start itself may already find the container between two of
	// Docker's restarts; otherwise the wait for the daemon does.
	info, err := acts.StartContainer(ctx, spec.SandboxID)
	if err == nil {
		err = acts.WaitReady(ctx, spec.SandboxID, info.Daemon)
	}
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%T: %v", err, err)
	require.Equal(t, api.KindOperationFailed, appErr.Type())
	require.True(t, appErr.NonRetryable())
	for _, w := range wants {
		require.Contains(t, appErr.Error(), w)
	}
	require.NoError(t, ctx.Err(), "it did not wait for the deadline")
}

// A daemon that exits at once inside its container (here a flag it does
// not know) is restarted by the container's supervisor, so Docker sees a
// running container: WaitReady counts the supervisor's restarts and ends
// with the daemon's own words, long before its deadline.
func TestWaitReadyReportsADaemonItsSupervisorKeepsRestarting(t *testing.T) {
	acts, _, spec := newDockerActivities(t)
	SetDaemonArgs(acts, []string{"--no-such-flag"})
	requireDaemonCannotStart(t, acts, spec, "restarted each time by its container's supervisor", "no-such-flag")
}

// Two worker processes of one build on one Docker host fill a new build's
// volume at the same time (CI's first test packages on a fresh machine do):
// each through a helper of its own, so neither removes the other's mid-fill,
// and both sandboxes start on the full binary.
func TestDaemonVolumeFilledByTwoWorkersAtOnce(t *testing.T) {
	src, err := os.ReadFile(testDaemonBinary(t))
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "sandbox-daemon")
	// A build of its own: the same program with bytes after its end.
	require.NoError(t, os.WriteFile(bin, append(src, []byte("\x00eos-test-"+randHex(8))...), 0o755))
	cli := requireDockerEngine(t)
	var vol string
	t.Cleanup(func() { // after both sandboxes are gone (cleanups run last first)
		if vol != "" {
			_ = cli.VolumeRemove(context.Background(), vol, false)
		}
	})
	a1, _, s1 := newDockerActivitiesWith(t, bin)
	a2, _, s2 := newDockerActivitiesWith(t, bin)
	vol = a1.currentDaemonVolume()
	require.NotEmpty(t, vol)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	errs := make(chan error, 2)
	for _, w := range []struct {
		acts *Activities
		spec workflows.SandboxSpec
	}{{a1, s1}, {a2, s2}} {
		go func() { _, err := w.acts.CreateContainer(ctx, w.spec); errs <- err }()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	for _, w := range []struct {
		acts *Activities
		id   string
	}{{a1, s1.SandboxID}, {a2, s2.SandboxID}} {
		started, err := w.acts.StartContainer(ctx, w.id)
		require.NoError(t, err)
		require.NoError(t, w.acts.WaitReady(ctx, w.id, started.Daemon), "sandbox %s starts on the full binary", w.id)
	}
	v, err := cli.VolumeInspect(ctx, vol)
	require.NoError(t, err)
	require.Equal(t, roleDaemon, v.Labels[LabelRole])
}

// TestPrepareSandboxForASpare: a spare's network and state volume, made
// ahead with our labels and adopted on a retry; the claim's container
// joins them, and the sandbox's removal takes all three.
func TestPrepareSandboxForASpare(t *testing.T) {
	acts, dc, spec := newDockerActivities(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := spec.SandboxID
	spare := workflows.SandboxSpec{SandboxID: id}
	require.NoError(t, acts.PrepareSandbox(ctx, spare))
	require.NoError(t, acts.PrepareSandbox(ctx, spare), "a retry adopts what the first attempt made")
	n, err := dc.NetworkInspect(ctx, networkName(id), network.InspectOptions{})
	require.NoError(t, err)
	require.Equal(t, id, n.Labels[LabelSandboxID])
	v, err := dc.VolumeInspect(ctx, workflows.VolumeName(id))
	require.NoError(t, err)
	require.Equal(t, id, v.Labels[LabelSandboxID])

	spec.WorkspaceRoot = t.TempDir()
	info, err := acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	c, err := dc.ContainerInspect(ctx, info.ContainerID)
	require.NoError(t, err)
	require.Equal(t, networkName(id), string(c.HostConfig.NetworkMode), "the container joins the spare's network")

	require.NoError(t, acts.RemoveSandbox(ctx, id))
	_, err = dc.NetworkInspect(ctx, networkName(id), network.InspectOptions{})
	require.Error(t, err, "the network is removed")
	_, err = dc.VolumeInspect(ctx, workflows.VolumeName(id))
	require.Error(t, err, "the volume is removed")
}
