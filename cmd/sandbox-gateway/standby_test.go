package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/gateway"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/worker"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// standbyOf waits until the gateway's /healthz shows a standby of image
// waiting for a claim, and returns its sandbox id.
func standbyOf(t *testing.T, g *testenv.Gateway, image string) string {
	t.Helper()
	var id string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		hz := healthz(t, g)
		list, _ := hz["standby_sandboxes"].([]any)
		for _, s := range list {
			m, _ := s.(map[string]any)
			if m["image"] == image && m["state"] == workflows.PhaseStandby {
				id, _ = m["sandbox_id"].(string)
				return
			}
		}
		assert.Fail(c, "no standby of "+image+" waits", "healthz standby_sandboxes: %v\nthe gateway's standby log:\n%s",
			hz["standby_sandboxes"], standbyLog(g))
	}, 2*time.Minute, 100*time.Millisecond)
	return id
}

// standbyLog is what the gateway logged of its standbys.
func standbyLog(g *testenv.Gateway) string {
	var b strings.Builder
	for _, l := range strings.Split(g.Stderr.String(), "\n") {
		if strings.Contains(l, "standby") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func listedIDs(t *testing.T, g *testenv.Gateway) []string {
	t.Helper()
	var ids []string
	for _, s := range mustCLI(t, g, mgr, "list_sandboxes")["sandboxes"].([]any) {
		ids = append(ids, s.(map[string]any)["id"].(string))
	}
	return ids
}

// TestStandbySandboxes: with --standby, a create starts one empty sandbox
// of its image, unlisted; the next create of the image claims it and holds
// that create's own workspace; a killed gateway's standby is taken back
// when it starts again, and a gateway that shuts down removes its standby.
func TestStandbySandboxes(t *testing.T) {
	// Killed while Docker makes the standby (a worker failpoint: the
	// first create's container is the first one started, the standby's
	// the second): started again, the standby's saga finishes and the
	// gateway takes it back.
	g := testenv.StartGatewayWith(t, testenv.GatewayOptions{Args: []string{"--standby=true"},
		Env: []string{worker.FailpointEnv + "=" + workflows.ActStartContainer + "#2"}})
	image := testenv.Images[0]
	workspace := func(tag string) string {
		ws := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
		for i := 0; i < 50; i++ {
			writeFile(t, filepath.Join(ws, "d", fmt.Sprintf("f%02d.txt", i)), tag+"\n")
		}
		return ws
	}
	create := func(ws string) string {
		t.Helper()
		id := mustCLI(t, g, mgr, "create_sandbox", "--image", image, "--workspace-root", ws)["id"].(string)
		cleanupSandbox(t, id)
		return id
	}
	read := func(id string) string {
		t.Helper()
		d := &drill{t: t, g: g, id: id}
		return strings.TrimSpace(fmt.Sprint(d.must("file_read", map[string]any{"path": "d/f49.txt"})["content"]))
	}

	first := create(workspace("one"))
	select {
	case <-g.Exited():
	case <-time.After(time.Minute):
		t.Fatalf("the failpoint did not kill the gateway while it made the standby; its standby log:\n%s", standbyLog(g))
	}
	killed := time.Now()
	g = testenv.StartGatewayWith(t, g.Options())
	sb := standbyOf(t, g, image)
	cleanupSandbox(t, sb)
	// No create since the restart: a standby now is the one the kill cut.
	created, err := exec.Command("docker", "inspect", "-f", "{{.Created}}", workflows.ContainerName(sb)).Output()
	require.NoError(t, err)
	at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(created)))
	require.NoError(t, err)
	require.True(t, at.Before(killed), "the standby cut by the kill (its container made at %v, the kill at %v) was finished and taken back", at, killed)
	require.NotEqual(t, first, sb)
	require.Equal(t, []string{first}, listedIDs(t, g), "a standby is no one's sandbox")
	require.Len(t, testenv.DockerObjects(t, "container", sb), 1, "the standby's container runs")

	ws2 := workspace("two")
	second := create(ws2)
	require.Equal(t, sb, second, "the create claimed the standby")
	require.Equal(t, "two", read(second), "the claimed sandbox holds its own create's workspace")
	require.Equal(t, "one", read(first))
	d := &drill{t: t, g: g, id: second}
	out := d.must("exec_command", map[string]any{"cmd": "ls d | wc -l", "yield_time_ms": 60000})
	require.Equal(t, "50", strings.TrimSpace(fmt.Sprint(out["output"])))
	require.ElementsMatch(t, []string{first, second}, listedIDs(t, g))

	// A standby whose container was stopped is not handed out: the create
	// makes a sandbox anew, and the stopped standby goes.
	sb = standbyOf(t, g, image)
	cleanupSandbox(t, sb)
	require.NoError(t, exec.Command("docker", "stop", "-t", "1", workflows.ContainerName(sb)).Run())
	fresh := create(workspace("fresh"))
	require.NotEqual(t, sb, fresh, "a stopped standby is not claimed")
	require.Equal(t, "fresh", read(fresh))
	require.Eventually(t, func() bool { return len(testenv.DockerObjects(t, "container", sb)) == 0 }, time.Minute, 100*time.Millisecond,
		"the stopped standby is removed")

	// Killed while a standby waits: the next run takes it back. The
	// claimed sandbox's container is gone meanwhile: the reconciler finds
	// it lost, and as an orphan it names its workspace root, though its
	// labels predate the claim (the memo of its workflow has it).
	sb = standbyOf(t, g, image)
	cleanupSandbox(t, sb)
	g.Kill()
	require.NoError(t, exec.Command("docker", "rm", "-f", workflows.ContainerName(second)).Run())
	opts := g.Options()
	opts.Reconcile = true
	g = testenv.StartGatewayWith(t, opts)
	require.Equal(t, sb, standbyOf(t, g, image), "the restarted gateway took back the standby the killed one left")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		orphans := mustCLI(t, g, mgr, "list_orphaned_sandboxes")["orphans"]
		list, _ := orphans.([]any)
		for _, o := range list {
			if m := o.(map[string]any); m["sandbox_id"] == second && m["workspace_root"] == ws2 {
				return
			}
		}
		assert.Fail(c, "the claimed sandbox, orphaned, names its workspace root", "orphans: %v", orphans)
	}, time.Minute, 200*time.Millisecond)
	third := create(workspace("three"))
	require.Equal(t, sb, third)
	require.Equal(t, "three", read(third))

	// A graceful stop removes the standby, and only it.
	sb = standbyOf(t, g, image)
	cleanupSandbox(t, sb)
	stopRemovesOnly(t, g, sb, first, fresh, third)
	require.Len(t, testenv.DockerObjects(t, "volume", second), 1, "the orphan keeps its work")
	require.Error(t, exec.Command("docker", "inspect", workflows.ContainerName(sb)).Run())
}

// TestSpareSandbox: with --standby the gateway starts its spare at once:
// a standby of no image, with its network and state volume and no
// container. A create of a missing image leaves it as it was. Killed while
// the spare waits, the gateway takes it back when it starts again. The
// first create of an image claims the spare and makes the container from
// there; the gateway is SIGKILLed right after Docker made that container
// (a worker failpoint) and, started again, finishes the create: ready,
// listed, whole. Killed again while the spare checks the image of another
// create's claim, it finishes that create too. A new spare and a standby of
// the image follow. A graceful
// stop removes both, and nothing of the claimed sandbox, which, its
// container lost, is an orphan that names its image and root.
func TestSpareSandbox(t *testing.T) {
	g := testenv.StartGatewayWith(t, testenv.GatewayOptions{Args: []string{"--standby=true"}})
	image := testenv.Images[0]
	spare := standbyOf(t, g, "")
	cleanupSandbox(t, spare)
	require.Len(t, testenv.DockerObjects(t, "network", spare), 1, "the spare's network is made")
	require.Len(t, testenv.DockerObjects(t, "volume", spare), 1, "the spare's state volume is made")
	require.Empty(t, testenv.DockerObjects(t, "container", spare), "no image yet, no container")
	require.Empty(t, listedIDs(t, g), "a spare is no one's sandbox")

	// A create of an image the host does not have is answered as it always
	// was, and changes nothing: the spare waits on, whole, and no standby
	// of that image follows.
	r := runCLI(t, g, mgr, "create_sandbox", "--image", "eos-test-missing:1", "--workspace-root", t.TempDir())
	require.Equal(t, 1, r.code, "stdout %s", r.stdout)
	require.Equal(t, api.KindInvalidRequest, r.errEnv["kind"], "%v", r.errEnv)
	require.Contains(t, r.errEnv["message"], "eos-test-missing:1 is not present on this Docker host")
	// Nor does a name that is no image reference, or one the Engine will
	// not look up (refused at once, not retried as a Docker failure).
	for _, bad := range []string{"Bad::Name", "UPPER/case:1"} {
		r := runCLI(t, g, mgr, "create_sandbox", "--image", bad, "--workspace-root", t.TempDir())
		require.Equal(t, 1, r.code, "stdout %s", r.stdout)
		require.Equal(t, api.KindInvalidRequest, r.errEnv["kind"], "%s: %v", bad, r.errEnv)
	}
	time.Sleep(gateway.DefaultStandbyDelay + time.Second) // past the moment a refill would start
	require.Equal(t, spare, standbyOf(t, g, ""), "the spare waits on")
	for _, kind := range []string{"network", "volume"} {
		require.Len(t, testenv.DockerObjects(t, kind, spare), 1, "the spare keeps its %s", kind)
	}
	standbys, _ := healthz(t, g)["standby_sandboxes"].([]any)
	require.Len(t, standbys, 1, "the spare alone: %v", standbys)
	require.Empty(t, listedIDs(t, g))

	// Killed while the spare waits; started again with a failpoint armed
	// (environment only): the claim's CreateContainer is the first it runs.
	g = restartArmed(t, g, workflows.ActCreateContainer)
	require.Equal(t, spare, standbyOf(t, g, ""), "the restarted gateway took back the spare the killed one left")

	g, ws := createKilledFinishes(t, g, image, spare, 200)
	require.Equal(t, []string{spare}, listedIDs(t, g), "the claimed spare is the create's sandbox")
	for _, kind := range []string{"container", "network", "volume"} {
		require.Len(t, testenv.DockerObjects(t, kind, spare), 1, kind)
	}
	next := standbyOf(t, g, "")
	cleanupSandbox(t, next)
	require.NotEqual(t, spare, next, "a new spare follows the claim")

	// Killed while the spare checks a claim's image (no standby of an image
	// waits: the create the restart finished started none, so the armed
	// run's first image check is the claim's): started again, the check
	// runs again and the create finishes on the spare, with that image.
	g = restartArmed(t, g, workflows.ActCheckImage)
	require.Equal(t, next, standbyOf(t, g, ""))
	other := testenv.Images[1]
	g, _ = createKilledFinishes(t, g, other, next, 50)
	require.ElementsMatch(t, []string{spare, next}, listedIDs(t, g))
	third := next
	next = standbyOf(t, g, "")
	cleanupSandbox(t, next)
	require.NotEqual(t, third, next, "a new spare follows that claim too")

	second := mustCLI(t, g, mgr, "create_sandbox", "--image", image, "--workspace-root", t.TempDir())["id"].(string)
	cleanupSandbox(t, second)
	sb := standbyOf(t, g, image)
	cleanupSandbox(t, sb)

	stopRemovesOnly(t, g, sb, spare, second, third)
	if second != next {
		for _, kind := range []string{"network", "volume"} {
			require.Empty(t, testenv.DockerObjects(t, kind, next), "the stopped gateway's spare %s", kind)
		}
	}

	// The claimed spare's container is lost while the gateway is down: as
	// an orphan it names its image and workspace root (its volume's labels
	// predate the claim; its workflow's memo has both), and its adoption
	// needs neither.
	require.NoError(t, exec.Command("docker", "rm", "-f", workflows.ContainerName(spare)).Run())
	opts := g.Options()
	opts.Reconcile = true
	g = testenv.StartGatewayWith(t, opts)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		list, _ := mustCLI(t, g, mgr, "list_orphaned_sandboxes")["orphans"].([]any)
		for _, o := range list {
			if m := o.(map[string]any); m["sandbox_id"] == spare {
				assert.Equal(c, image, m["image"], "%v", m)
				assert.Equal(c, ws, m["workspace_root"], "%v", m)
				return
			}
		}
		assert.Fail(c, "the claimed spare, its container lost, is an orphan", "orphans: %v", list)
	}, time.Minute, 200*time.Millisecond)
	rec := mustCLI(t, g, mgr, "adopt_orphaned_sandbox", "--sandbox-id", spare)
	require.Equal(t, "ready", rec["state"], "%v", rec)
	require.Equal(t, image, rec["image"], "%v", rec)
}

// stopRemovesOnly stops g gracefully: the standby sb loses its container,
// network and volume, and each of the sandboxes keeps its own.
func stopRemovesOnly(t *testing.T, g *testenv.Gateway, sb string, sandboxes ...string) {
	t.Helper()
	g.Stop()
	for _, kind := range []string{"container", "network", "volume"} {
		require.Empty(t, testenv.DockerObjects(t, kind, sb), "the stopped gateway's standby %s", kind)
		for _, id := range sandboxes {
			require.Len(t, testenv.DockerObjects(t, kind, id), 1, "sandbox %s keeps its %s", id, kind)
		}
	}
}

// restartArmed kills g and starts it again with the worker failpoint at
// activity armed (environment only: the restarted gateway's Options drop it).
func restartArmed(t *testing.T, g *testenv.Gateway, activity string) *testenv.Gateway {
	t.Helper()
	g.Kill()
	armed := g.Options()
	armed.Env = []string{worker.FailpointEnv + "=" + activity}
	return testenv.StartGatewayWith(t, armed)
}

// createKilledFinishes runs a create_sandbox of a files-file workspace
// that the gateway's armed failpoint kills it under (the create fails, the
// gateway is gone), starts the gateway again, and waits until the sandbox
// id the create took is ready with the whole workspace. It returns the
// new gateway and the workspace.
func createKilledFinishes(t *testing.T, g *testenv.Gateway, image, id string, files int) (*testenv.Gateway, string) {
	t.Helper()
	ws := numberedTree(t, files)
	out, err := exec.Command(filepath.Join(g.Bins, "sandbox-manager-cli"), "--gateway-endpoint", g.Addr, "--gateway-auth-token", g.Token,
		"create_sandbox", "--image", image, "--workspace-root", ws).CombinedOutput()
	require.Error(t, err, "the gateway died under the create: %s", out)
	select {
	case <-g.Exited():
	case <-time.After(time.Minute):
		t.Fatalf("the failpoint did not kill the gateway; the create answered: %s", out)
	}
	start := time.Now()
	g = testenv.StartGatewayWith(t, g.Options())
	(&drill{t: t, g: g, id: id}).readyWithTree(start, files)
	return g, ws
}

// TestStandbyClaimKilledMidway: the gateway (its Temporal and worker with
// it) is SIGKILLed in a claim at the worst moment, right after the daemon
// imported the create's workspace into the claimed standby and before
// Temporal heard of it (a worker failpoint, so the kill lands there every
// run); started again, the import is repeated safely and the sandbox
// finishes as that create's, whole, listed, with one container, and the
// restarted gateway does not take it for a standby.
func TestStandbyClaimKilledMidway(t *testing.T) {
	g := testenv.StartGatewayWith(t, testenv.GatewayOptions{Args: []string{"--standby=true"}})
	image := testenv.Images[0]
	first := mustCLI(t, g, mgr, "create_sandbox", "--image", image, "--workspace-root", t.TempDir())["id"].(string)
	cleanupSandbox(t, first)
	sb := standbyOf(t, g, image)
	cleanupSandbox(t, sb)

	// The failpoint is armed in a gateway started after the first create
	// imported its workspace: it takes the standby back, and the claim's
	// import is the first it runs.
	g = restartArmed(t, g, workflows.ActImportWorkspace)
	require.Equal(t, sb, standbyOf(t, g, image), "the restarted gateway took back its standby")

	g, ws := createKilledFinishes(t, g, image, sb, 3000)
	require.ElementsMatch(t, []string{first, sb}, listedIDs(t, g), "the claimed standby is listed as the create's sandbox")
	for _, s := range mustCLI(t, g, mgr, "list_sandboxes")["sandboxes"].([]any) {
		if r := s.(map[string]any); r["id"] == sb {
			require.Equal(t, ws, r["workspace_root"], "the record names the claim's workspace")
		}
	}
	for _, kind := range []string{"container", "network", "volume"} {
		require.Len(t, testenv.DockerObjects(t, kind, sb), 1, kind)
	}
	// The restarted gateway makes a new standby; the claimed one is not it.
	last2 := mustCLI(t, g, mgr, "create_sandbox", "--image", image, "--workspace-root", t.TempDir())["id"].(string)
	cleanupSandbox(t, last2)
	next := standbyOf(t, g, image)
	cleanupSandbox(t, next)
	require.NotEqual(t, sb, next)
}
