package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/worker"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// drill is one sandbox driven over HTTP through a gateway process.
type drill struct {
	t  *testing.T
	g  *gatewayProc
	id string
}

func (d *drill) op(name string, args map[string]any) (map[string]any, *api.Error) {
	d.t.Helper()
	scope := map[string]any{"kind": "sandbox", "sandbox_id": d.id}
	if o, _ := api.LookupOp(name); o.Scope == api.ScopeSystem {
		scope = map[string]any{"kind": "system"}
		if args == nil {
			args = map[string]any{}
		}
		if _, ok := args["sandbox_id"]; !ok && d.id != "" && name != "list_sandboxes" && name != "list_orphaned_sandboxes" {
			args["sandbox_id"] = d.id
		}
	}
	_, b, err := d.g.HTTPOp(name, map[string]any{"scope": scope, "args": args, "request_id": "drill-" + client.NewRequestID()[:12]})
	require.NoError(d.t, err)
	var m map[string]any
	require.NoError(d.t, json.Unmarshal(b, &m), "%s", b)
	if e, ok := m["error"].(map[string]any); ok {
		return nil, &api.Error{Kind: fmt.Sprint(e["kind"]), Message: fmt.Sprint(e["message"])}
	}
	return m, nil
}

func (d *drill) must(name string, args map[string]any) map[string]any {
	d.t.Helper()
	m, err := d.op(name, args)
	require.Nil(d.t, err, "%s: %v", name, err)
	return m
}

// servedWithin waits until a runtime op in the session succeeds again and
// returns how long it took from since.
func (d *drill) servedWithin(since time.Time, max time.Duration, ws, path, want string) time.Duration {
	d.t.Helper()
	var last *api.Error
	for time.Since(since) < max {
		m, err := d.op("file_read", map[string]any{"workspace_session_id": ws, "path": path})
		if err == nil {
			require.Equal(d.t, want, strings.TrimRight(fmt.Sprint(m["content"]), "\n"), "the session's unpublished work is intact")
			return time.Since(since)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	d.t.Fatalf("not served within %s after the event: %v", max, last)
	return 0
}

// daemonHealth returns a reader of the sandbox's daemon's /health (with the
// sandbox token), straight to its port: made before a call that keeps the
// sandbox's workflow busy, since inspect_sandbox would wait for it.
func (d *drill) daemonHealth() func() (map[string]any, error) {
	d.t.Helper()
	secret, err := worker.LoadOrCreateSecret(filepath.Join(d.g.StateDir, "gateway.secret"))
	require.NoError(d.t, err)
	port := int(d.must("inspect_sandbox", nil)["daemon"].(map[string]any)["port"].(float64))
	hc := &http.Client{Timeout: 5 * time.Second}
	return func() (map[string]any, error) {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/health", port), nil)
		req.Header.Set("Authorization", "Bearer "+daemonclient.Token(secret, d.id))
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var h map[string]any
		return h, json.NewDecoder(resp.Body).Decode(&h)
	}
}

// waitPublishReached waits until the daemon has a publish in flight, or
// has committed one since manifest version v (a publish quicker than the
// first look), as health says.
func (d *drill) waitPublishReached(health func() (map[string]any, error), v float64) {
	d.t.Helper()
	var last map[string]any
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		h, err := health()
		if err != nil {
			continue
		}
		last = h
		ops, _ := h["in_flight_ops"].(map[string]any)
		if n, _ := ops["publish_workspace_session"].(float64); n > 0 {
			return
		}
		if mv, _ := h["manifest_version"].(float64); mv > v {
			d.t.Logf("the publish committed before the first look (manifest version %v)", mv)
			return
		}
	}
	d.t.Fatalf("the daemon never had the publish: %v", last)
}

func (d *drill) manifestVersion() float64 {
	d.t.Helper()
	m := d.must("layerstack", nil)
	return m["manifest_version"].(float64)
}

func (d *drill) container() string { return workflows.ContainerName(d.id) }

func dockerOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	require.NoError(t, err, "docker %v: %s", args, out)
	return string(out)
}

func docker(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	require.NoError(t, err, "docker %v: %s", args, out)
}

// TestRecoveryDrills: events outside the user's control — a container
// restart, a kill and start, an Engine restart (stop and start of every
// sandbox container through the Engine), a daemon frozen for a minute, a
// SIGKILLed gateway with its embedded Temporal, a gateway started with an
// empty state dir beside live sandboxes — lose no work, and afterwards the
// sandbox serves again without a repair command. Each publish caught by an
// event commits exactly once.
func TestRecoveryDrills(t *testing.T) {
	top := t
	g := startGatewayProcess(t)
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "f.txt"), "base\n")
	create := func() *drill {
		rec := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", ws)
		id := rec["id"].(string)
		cleanupSandbox(t, id)
		return &drill{t: t, g: g, id: id}
	}
	d := create()
	session := func(d *drill, content string) string {
		ws := d.must("create_workspace_session", nil)["workspace_session_id"].(string)
		d.must("file_write", map[string]any{"workspace_session_id": ws, "path": "work.txt", "content": content})
		return ws
	}

	// bulk makes a session's publish take long enough (~1000 files) for an
	// event to land in its middle.
	bulk := func(d *drill, ws, prefix string) {
		out := d.must("exec_command", map[string]any{"workspace_session_id": ws, "yield_time_ms": 120000,
			"cmd": "mkdir -p bulk && for i in $(seq 1 1000); do echo " + prefix + "$i > bulk/$i; done"})
		require.Equal(d.t, "ok", out["status"], "%v", out)
	}
	bulkPublished := func(d *drill, prefix string) {
		m := d.must("file_read", map[string]any{"path": "bulk/1000"})
		require.Equal(d.t, prefix+"1000", strings.TrimRight(fmt.Sprint(m["content"]), "\n"))
	}

	// A container restart and a kill followed by a start, each with the
	// sandbox idle and in the middle of a publish.
	events := []struct {
		name string
		do   func(t *testing.T, d *drill) time.Time
	}{
		{"docker restart", func(t *testing.T, d *drill) time.Time {
			start := time.Now()
			docker(t, "restart", "-t", "2", d.container())
			return start
		}},
		{"docker kill and start", func(t *testing.T, d *drill) time.Time {
			docker(t, "kill", d.container())
			start := time.Now()
			docker(t, "start", d.container())
			return start
		}},
	}
	for i, ev := range events {
		t.Run(ev.name+", idle", func(t *testing.T) {
			d.t = t
			content := fmt.Sprintf("idle-%d", i)
			ws := session(d, content)
			start := ev.do(t, d)
			took := d.servedWithin(start, 60*time.Second, ws, "work.txt", content)
			t.Logf("first op served %s after the container started", took.Round(time.Millisecond))
			v := d.manifestVersion()
			d.must("publish_workspace_session", map[string]any{"workspace_session_id": ws})
			require.Equal(t, v+1, d.manifestVersion(), "the publish after the restart commits once")
		})
		t.Run(ev.name+", in the middle of a publish", func(t *testing.T) {
			d.t = t
			prefix := fmt.Sprintf("mid%d-", i)
			ws := session(d, prefix+"work")
			bulk(d, ws, prefix)
			v := d.manifestVersion()
			done := make(chan *api.Error, 1)
			go func() {
				_, err := d.op("publish_workspace_session", map[string]any{"workspace_session_id": ws})
				done <- err
			}()
			time.Sleep(200 * time.Millisecond)
			start := ev.do(t, d)
			select {
			case err := <-done:
				require.Nil(t, err, "the publish caught by the event completes")
			case <-time.After(3 * time.Minute):
				t.Fatal("the publish caught by the event never ended")
			}
			t.Logf("publish ended %s after the container started", time.Since(start).Round(time.Millisecond))
			require.Equal(t, v+1, d.manifestVersion(), "exactly one layer")
			m := d.must("file_read", map[string]any{"path": "work.txt"})
			require.Equal(t, prefix+"work", strings.TrimRight(fmt.Sprint(m["content"]), "\n"))
			bulkPublished(d, prefix)
		})
	}

	t.Run("publish fails: the state volume is full", func(t *testing.T) {
		d.t = t
		ws := session(d, "too-big")
		out := d.must("exec_command", map[string]any{"workspace_session_id": ws, "yield_time_ms": 120000, "cmd": "head -c 1048576 /dev/zero | tr '\\0' a > big.txt"})
		require.Equal(t, "ok", out["status"], "%v", out)
		pid := strings.TrimSpace(dockerOut(t, "inspect", "-f", "{{.State.Pid}}", d.container()))
		// A 16 KiB tmpfs over the layer store's staging dir: the new layer
		// cannot be written.
		nsenter := func(args ...string) {
			out, err := exec.Command("nsenter", append([]string{"-t", pid, "-m", "--"}, args...)...).CombinedOutput()
			require.NoError(t, err, "%v: %s", args, out)
		}
		nsenter("mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", "/eos/layerstack/staging")
		v := d.manifestVersion()
		_, perr := d.op("publish_workspace_session", map[string]any{"workspace_session_id": ws})
		nsenter("umount", "/eos/layerstack/staging")
		require.NotNil(t, perr, "a publish that cannot write its layer fails")
		require.NotContains(t, perr.Message, "/eos/", "no internal path: %s", perr.Message)
		require.Equal(t, v, d.manifestVersion(), "nothing committed")
		// The session is not stuck: it runs commands and publishes.
		out = d.must("exec_command", map[string]any{"workspace_session_id": ws, "yield_time_ms": 120000, "cmd": "wc -c < big.txt"})
		require.Contains(t, fmt.Sprint(out["output"]), "1048576")
		// A full volume under the publish records: the commit stands and
		// the session is closed before the answer, one layer.
		nsenter("mkdir", "-p", "/eos/txns")
		nsenter("mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", "/eos/txns")
		fill := exec.Command("nsenter", "-t", pid, "-m", "--", "sh", "-c", "head -c 16384 /dev/zero > /eos/txns/fill")
		_ = fill.Run() // fills it (the write itself fails at the end)
		_, perr = d.op("publish_workspace_session", map[string]any{"workspace_session_id": ws})
		nsenter("umount", "/eos/txns")
		require.Nil(t, perr, "the publish commits even where its record cannot be written")
		require.Equal(t, v+1, d.manifestVersion())
		_, gone := d.op("exec_command", map[string]any{"workspace_session_id": ws, "cmd": "true"})
		require.NotNil(t, gone, "the published session is closed")
	})

	t.Run("engine restart: every sandbox container stopped and started", func(t *testing.T) {
		d.t = t
		d2 := create()
		ws1, ws2 := session(d, "engine-1"), session(d2, "engine-2")
		docker(t, "stop", "-t", "2", d.container(), d2.container())
		start := time.Now()
		docker(t, "start", d.container(), d2.container())
		t.Logf("served %s / %s after the restart", d.servedWithin(start, 60*time.Second, ws1, "work.txt", "engine-1").Round(time.Millisecond),
			d2.servedWithin(start, 60*time.Second, ws2, "work.txt", "engine-2").Round(time.Millisecond))
		d.must("publish_workspace_session", map[string]any{"workspace_session_id": ws1})
		d2.must("publish_workspace_session", map[string]any{"workspace_session_id": ws2})
	})

	t.Run("daemon frozen for 60 s during a publish", func(t *testing.T) {
		d.t = t
		ws := session(d, "paused")
		v := d.manifestVersion()
		done := make(chan *api.Error, 1)
		go func() {
			_, err := d.op("publish_workspace_session", map[string]any{"workspace_session_id": ws})
			done <- err
		}()
		time.Sleep(10 * time.Millisecond)
		docker(t, "pause", d.container())
		time.Sleep(60 * time.Second)
		start := time.Now()
		docker(t, "unpause", d.container())
		select {
		case err := <-done:
			if err != nil {
				// A publish that gave up cleanly committed nothing and left the
				// session usable: it publishes now.
				require.Equal(t, v, d.manifestVersion(), "a failed publish commits nothing: %v", err)
				d.must("publish_workspace_session", map[string]any{"workspace_session_id": ws})
			}
		case <-time.After(5 * time.Minute):
			t.Fatal("the publish caught by the pause never ended")
		}
		t.Logf("publish settled %s after unpause", time.Since(start).Round(time.Millisecond))
		require.Equal(t, v+1, d.manifestVersion(), "exactly one layer")
	})

	t.Run("gateway SIGKILL with its Temporal, in the middle of a publish", func(t *testing.T) {
		d.t = t
		ws := session(d, "gateway-killed")
		bulk(d, ws, "g")
		v := d.manifestVersion()
		health := d.daemonHealth()
		go func() {
			// The gateway dies under this call: its answer is lost, not its publish.
			_, _, _ = g.HTTPOp("publish_workspace_session", map[string]any{"scope": map[string]any{"kind": "sandbox", "sandbox_id": d.id},
				"args": map[string]any{"workspace_session_id": ws}})
		}()
		// Killed once the daemon has the publish: before that, the update
		// is not yet durable in Temporal and the kill loses the call itself
		// (its client sees the connection drop and retries).
		d.waitPublishReached(health, v)
		g.Kill()
		start := time.Now()
		g2 := testenv.StartGatewayWith(top, g.Options())
		d.g = g2
		require.Eventually(t, func() bool {
			m, err := d.op("layerstack", nil)
			return err == nil && m["manifest_version"].(float64) == v+1
		}, 2*time.Minute, 100*time.Millisecond, "the publish caught by the kill commits once after the restart")
		t.Logf("publish committed %s after the gateway started again", time.Since(start).Round(time.Millisecond))
		m := d.must("file_read", map[string]any{"path": "work.txt"})
		require.Equal(t, "gateway-killed", strings.TrimRight(fmt.Sprint(m["content"]), "\n"))
		bulkPublished(d, "g")
		g = g2
	})

	t.Run("a gateway with an empty state dir beside live sandboxes", func(t *testing.T) {
		d.t = t
		d.g = g
		ws := session(d, "kept-across-deployments")
		g.Kill()
		other := testenv.StartGatewayWith(t, testenv.GatewayOptions{Reconcile: true})
		o := &drill{t: t, g: other}
		require.NotEmpty(t, testenv.DockerObjects(t, "volume", d.id), "the killed gateway left its sandbox's volume")
		orphans := o.must("list_orphaned_sandboxes", nil)["orphans"].([]any)
		var found map[string]any
		for _, x := range orphans {
			if x.(map[string]any)["sandbox_id"] == d.id {
				found = x.(map[string]any)
			}
		}
		require.NotNil(t, found, "the other deployment's sandbox is listed: %v", orphans)
		require.Equal(t, false, found["owned_by_this_deployment"])
		require.Greater(t, found["volume_bytes"].(float64), float64(0))
		require.NotEmpty(t, testenv.DockerObjects(t, "volume", d.id), "nothing deleted")

		_, err := o.op("delete_orphaned_sandbox", map[string]any{"sandbox_id": d.id})
		require.NotNil(t, err, "delete needs confirm")
		require.Equal(t, api.KindInvalidRequest, err.Kind)

		start := time.Now()
		rec := o.must("adopt_orphaned_sandbox", map[string]any{"sandbox_id": d.id})
		require.Equal(t, "ready", rec["state"])
		o.id = d.id
		t.Logf("adopted in %s", time.Since(start).Round(time.Millisecond))
		o.servedWithin(time.Now(), 30*time.Second, ws, "work.txt", "kept-across-deployments")
		v := o.manifestVersion()
		o.must("publish_workspace_session", map[string]any{"workspace_session_id": ws})
		require.Equal(t, v+1, o.manifestVersion())
		_, err = o.op("adopt_orphaned_sandbox", map[string]any{"sandbox_id": d.id})
		require.NotNil(t, err, "a live sandbox is no orphan")
	})
}

// TestCreateKilledMidway: the gateway is SIGKILLed (its Temporal and worker
// with it) once create_sandbox's container exists, while Docker starts it —
// the workspace the worker packed in memory for the import
// (activities/prefetch.go) dies with it. Started again, the create
// finishes from the tree on disk: the sandbox is ready with the whole
// workspace, and it has one container, one network and one state volume.
func TestCreateKilledMidway(t *testing.T) {
	g := startGatewayProcess(t)
	ws := numberedTree(t, 300)
	rec := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-root", ws, "--async")
	id := rec["id"].(string)
	cleanupSandbox(t, id)
	require.Eventually(t, func() bool { return exec.Command("docker", "inspect", workflows.ContainerName(id)).Run() == nil },
		time.Minute, 5*time.Millisecond, "the container is made")
	g.Kill()
	start := time.Now()
	g = testenv.StartGatewayWith(t, g.Options())
	d := &drill{t: t, g: g, id: id}
	d.readyWithTree(start, 300)
	for _, kind := range []string{"container", "network", "volume"} {
		require.Len(t, testenv.DockerObjects(t, kind, id), 1, kind)
	}
}

// numberedTree is a workspace of n files d/f<i>.txt reading "file <i>".
func numberedTree(t *testing.T, n int) string {
	t.Helper()
	ws := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "d"), 0o755))
	for i := 0; i < n; i++ {
		writeFile(t, filepath.Join(ws, "d", fmt.Sprintf("f%d.txt", i)), fmt.Sprintf("file %d\n", i))
	}
	return ws
}

// readyWithTree waits until the sandbox, whose create a killed gateway cut,
// is ready under the gateway started at start, and requires numberedTree's
// n files in it, whole.
func (d *drill) readyWithTree(start time.Time, n int) {
	d.t.Helper()
	require.EventuallyWithT(d.t, func(c *assert.CollectT) {
		m, err := d.op("inspect_sandbox", nil)
		if assert.Nil(c, err, "inspect_sandbox") {
			assert.Equal(c, "ready", m["state"], "the create cut by the kill finishes")
		}
	}, 3*time.Minute, 100*time.Millisecond)
	d.t.Logf("ready %s after the gateway started again", time.Since(start).Round(time.Millisecond))
	m := d.must("file_read", map[string]any{"path": fmt.Sprintf("d/f%d.txt", n-1)})
	require.Equal(d.t, fmt.Sprintf("file %d", n-1), strings.TrimRight(fmt.Sprint(m["content"]), "\n"))
	out := d.must("exec_command", map[string]any{"cmd": "ls d | wc -l", "yield_time_ms": 60000})
	require.Equal(d.t, fmt.Sprint(n), strings.TrimSpace(fmt.Sprint(out["output"])), "%v", out)
}
