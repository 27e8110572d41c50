package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	tclient "go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/worker"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// cluster is the environment scripts/cluster/test.sh set up: a gateway
// --no-workers, a Temporal server on PostgreSQL, and namespaced Docker
// hosts each with its own Engine and sandbox-worker.
type cluster struct {
	g      *testenv.Gateway
	work   string
	hosts  []string
	docker map[string]string // host -> DOCKER_HOST
	script string
	env    map[string]string
}

func loadCluster(t *testing.T) *cluster {
	path := os.Getenv("EOS_CLUSTER_ENV")
	if path == "" {
		t.Skip("needs the cluster of scripts/cluster/test.sh (make test-cluster)")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	tok, err := os.ReadFile(env["TOKEN_FILE"])
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{g: &testenv.Gateway{Addr: env["GATEWAY"], Token: strings.TrimSpace(string(tok))}, work: env["WORK"],
		hosts: strings.Fields(env["HOSTS"]), docker: map[string]string{}, script: env["HOST_SCRIPT"], env: env}
	for _, h := range c.hosts {
		c.docker[h] = env["DOCKER_"+h]
	}
	return c
}

// op runs one operation through the gateway; it returns the result or the
// error object, and the HTTP status.
func (c *cluster) op(t *testing.T, op, sandboxID string, args map[string]any) (int, map[string]any) {
	t.Helper()
	body := map[string]any{"args": args}
	if sandboxID != "" {
		body["scope"] = map[string]any{"kind": "sandbox", "sandbox_id": sandboxID}
	}
	st, b, err := c.g.HTTPOp(op, body)
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: HTTP %d, not JSON: %s", op, st, b)
	}
	if e, ok := m["error"].(map[string]any); ok && st != http.StatusOK {
		return st, e
	}
	return st, m
}

func (c *cluster) must(t *testing.T, op, sandboxID string, args map[string]any) map[string]any {
	t.Helper()
	st, m := c.op(t, op, sandboxID, args)
	if st != http.StatusOK {
		t.Fatalf("%s on %s: HTTP %d %s", op, sandboxID, st, mustJSON(m))
	}
	return m
}

// containersOn lists the containers of a sandbox on one host's Engine.
func (c *cluster) containersOn(t *testing.T, host, id string) []string {
	t.Helper()
	out, err := exec.Command("docker", "-H", c.docker[host], "ps", "-aq", "--filter", "label=eos.sandbox_id="+id).Output()
	if err != nil {
		t.Fatalf("docker on %s: %v", host, err)
	}
	return strings.Fields(string(out))
}

func (c *cluster) hostCmd(t *testing.T, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{c.script}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("host.sh %v: %v\n%s", args, err, out)
	}
}

// clusterEventually polls cond until it holds; the bound only keeps a broken
// cluster from hanging the run (the host-loss path waits out
// workflows.HostStaleAfter, 12 s).
func clusterEventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
	}
	t.Fatalf("%s: never happened; last: %s", what, last)
}

// TestCluster: one gateway, a Temporal cluster on PostgreSQL and two
// namespaced Docker hosts behave like `make run`: a sandbox on each host,
// the seed flow on both through the one gateway, each sandbox's containers
// only on its host; a lost host makes its sandboxes unavailable (clearly,
// at once) while the other keeps working, and they come back with it.
func TestCluster(t *testing.T) {
	c := loadCluster(t)
	if len(c.hosts) < 2 {
		t.Fatalf("want two hosts, have %v", c.hosts)
	}
	h1, h2 := c.hosts[0], c.hosts[1]

	// The cluster answers only certificates of its CA: a client without
	// one (plaintext, or TLS without a client certificate) gets nowhere.
	if addr := c.env["TEMPORAL"]; addr != "" {
		pool := x509.NewCertPool()
		if b, err := os.ReadFile(c.env["TLS_CA"]); err != nil || !pool.AppendCertsFromPEM(b) {
			t.Fatalf("cluster CA: %v", err)
		}
		for name, opts := range map[string]tclient.ConnectionOptions{
			"plaintext":          {},
			"TLS without a cert": {TLS: &tls.Config{RootCAs: pool}},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			cl, err := tclient.DialContext(ctx, tclient.Options{HostPort: addr, ConnectionOptions: opts})
			cancel()
			if err == nil {
				cl.Close()
				t.Errorf("Temporal answered a client with %s", name)
			}
		}
	}

	// Host-scoped reads run on the named host; an unknown host is refused.
	for _, h := range c.hosts {
		imgs := c.must(t, "list_docker_images", "", map[string]any{"host": h})
		if !strings.Contains(mustJSON(imgs), testenv.Images[0]) {
			t.Errorf("list_docker_images on %s: %s", h, mustJSON(imgs))
		}
		dirs := c.must(t, "list_workspace_directories", "", map[string]any{"host": h, "path": c.work})
		if dirs["path"] != c.work {
			t.Errorf("list_workspace_directories on %s: %s", h, mustJSON(dirs))
		}
	}
	if st, e := c.op(t, "list_docker_images", "", map[string]any{"host": "nowhere"}); st == http.StatusOK || e["kind"] != "invalid_request" {
		t.Errorf("unknown host: HTTP %d %s", st, mustJSON(e))
	}
	if st, e := c.op(t, "create_sandbox", "", map[string]any{"image": testenv.Images[0], "workspace_root": c.work, "host": "../h1"}); st == http.StatusOK || e["kind"] != "invalid_request" {
		t.Errorf("hostile host name: HTTP %d %s", st, mustJSON(e))
	}

	if hz := healthz(t, c.g); hz["status"] != "ok" {
		t.Errorf("/healthz of the cluster: %s", mustJSON(hz))
	}

	// A sandbox on each host, created side by side.
	ids := map[string]string{}
	wss := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, h := range c.hosts {
		ws := filepath.Join(c.work, "ws-"+h)
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(ws, "f.txt"), "base "+h+"\n")
		writeFile(t, filepath.Join(ws, "shared.txt"), "alpha\nbravo\ncharlie\ndelta\necho\n")
		wg.Add(1)
		go func(h, ws string) {
			defer wg.Done()
			st, rec := c.op(t, "create_sandbox", "", map[string]any{"image": testenv.Images[0], "workspace_root": ws, "host": h})
			mu.Lock()
			defer mu.Unlock()
			if st != http.StatusOK || rec["state"] != "ready" || rec["host"] != h {
				t.Errorf("create_sandbox on %s: HTTP %d %s", h, st, mustJSON(rec))
				return
			}
			ids[h], wss[h] = rec["id"].(string), ws
		}(h, ws)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("sandboxes: %v", ids)
	for _, h := range c.hosts {
		for _, other := range c.hosts {
			n := len(c.containersOn(t, other, ids[h]))
			if want := map[bool]int{true: 1, false: 0}[other == h]; n != want {
				t.Errorf("sandbox of %s has %d containers on %s, want %d", h, n, other, want)
			}
		}
	}

	// The seed flow on both, side by side, through the one gateway.
	for _, h := range c.hosts {
		wg.Add(1)
		go func(h string) { defer wg.Done(); clusterSeedFlow(t, c, h, ids[h]) }(h)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Each sandbox's workflow runs on whichever host's worker took it; its
	// daemon calls reached the daemon from there (through the forwarder of
	// the sandbox's host when that is another), none fell back for being
	// on another host.
	clusterLocalCalls(t, c, ids)

	// The views of a busy sandbox read the copy of its state that the host
	// whose worker runs its workflow serves through its forwarder (this
	// gateway runs no workflow), and read their writes.
	busyViews(t, c.g, ids[h2], "host_copy", "host_copy_after_wait")

	clusterCrossHostCrash(t, c, h1, h2, ids[h2])

	// Streams cross the host link: a command's output as SSE progress.
	sse := sseOp(t, c.g, "exec_command", ids[h2], map[string]any{"cmd": "for i in 1 2 3; do echo line-$i; done"})
	if !strings.Contains(sse, "line-1") || !strings.Contains(sse, "line-3") || !strings.Contains(sse, "event: result") {
		t.Errorf("SSE exec through the forwarder:\n%s", sse)
	}

	// The daemon's live events stream (SSE) crosses it too.
	if first := firstEvent(t, c.g, ids[h2]); !strings.Contains(first, "event: event") {
		t.Errorf("events stream through the forwarder: %q", first)
	}

	// Lose h1: its worker dies (SIGKILL, no goodbye) and its Engine stops.
	c.hostCmd(t, []string{"SIG=KILL"}, "stop-worker", h1)
	c.hostCmd(t, nil, "stop-engine", h1)
	// Just dead, not yet lost by the registry: an op then waits on the
	// dead worker's queue (a daemon call re-resolves the daemon through
	// the sandbox workflow; a create runs on its host). Each still answers
	// unavailable once the host is lost, not after the update's timeout.
	justDead := map[string]map[string]any{"exec_command": {"cmd": "true"}, "create_workspace_session": {}, "file_read": {"path": "shared.txt"}}
	answers := make(chan string, len(justDead))
	var pendingMu sync.Mutex
	pending := map[string]time.Time{} // the ops not answered yet, by when they were sent
	for op := range justDead {
		pending[op] = time.Now()
	}
	for op, args := range justDead {
		go func(op string, args map[string]any) {
			st, e := c.op(t, op, ids[h1], args)
			answered := time.Now()
			pendingMu.Lock()
			t.Logf("%s on the just-dead host answered in %s", op, answered.Sub(pending[op]).Round(time.Millisecond))
			delete(pending, op)
			pendingMu.Unlock()
			d, _ := e["details"].(map[string]any)
			// A create was accepted and finishes when the host is back;
			// a daemon call was never made. A create the gateway took up
			// only once h1 was lost (stopping an Engine can take most of
			// the stale window, a beat can be late, and finding the
			// sandbox's host can wait on the dead worker first) is refused
			// up front, as on a lost host: right whenever h1 was stale by
			// the answer (the gateway checks before it answers; it was
			// measured from the send, and a create the gateway reached
			// seconds later failed CI).
			inFlight := d["in_flight"] == true
			wantInFlight := op == "create_workspace_session"
			if seen, err := time.Parse(time.RFC3339Nano, fmt.Sprint(d["last_seen"])); err == nil && wantInFlight && !inFlight &&
				answered.Sub(seen) > workflows.HostStaleAfter-time.Second {
				wantInFlight = false
			}
			if st == http.StatusOK || e["kind"] != "operation_failed" || d["availability"] != "unavailable" || inFlight != wantInFlight {
				answers <- fmt.Sprintf("%s on the just-dead host: HTTP %d %s", op, st, mustJSON(e))
				return
			}
			answers <- ""
		}(op, args)
	}
	for range justDead {
		select {
		case a := <-answers:
			if a != "" {
				t.Error(a)
			}
		case <-time.After(90 * time.Second): // lost after 12 s; resolve_daemon gives up after 30 s
			pendingMu.Lock()
			t.Fatalf("ops on the just-dead host %s not answered in 90 s: %v (the gateway's log is kept in %s.logs)", h1, pending, "$CLUSTER_DIR")
		}
	}
	// Lost by the registry (12 s without a beat), not only slow to answer:
	// a query of the sandbox's workflow may first time out while its sticky
	// worker is the dead one, which also says unavailable.
	clusterEventually(t, "h1's sandbox listed unavailable and h1 lost by the registry", func() (bool, string) {
		_, rec := c.op(t, "inspect_sandbox", "", map[string]any{"sandbox_id": ids[h1]})
		hz := healthz(t, c.g)
		return rec["availability"] == "unavailable" && hz["status"] == "degraded" && strings.Contains(mustJSON(hz["docker"]), `"host":"`+h1+`"`),
			mustJSON(rec) + " " + mustJSON(hz)
	})
	if hz := healthz(t, c.g); hz["status"] != "degraded" || !strings.Contains(mustJSON(hz["docker"]), `"host":"`+h1+`"`) {
		t.Errorf("/healthz with %s lost: %s", h1, mustJSON(hz))
	}
	st, e := c.op(t, "exec_command", ids[h1], map[string]any{"cmd": "true"})
	if st == http.StatusOK || e["kind"] != "operation_failed" || !strings.Contains(fmt.Sprint(e["message"]), "host "+h1) {
		t.Errorf("exec on the lost host: HTTP %d %s", st, mustJSON(e))
	}
	if d, _ := e["details"].(map[string]any); d["availability"] != "unavailable" || d["host"] != h1 {
		t.Errorf("exec on the lost host: details %s", mustJSON(e))
	}
	if st, e := c.op(t, "create_workspace_session", ids[h1], map[string]any{}); st == http.StatusOK || e["kind"] != "operation_failed" {
		t.Errorf("lifecycle op on the lost host: HTTP %d %s", st, mustJSON(e))
	}
	snap := c.must(t, "snapshot", "", map[string]any{})
	nodes := map[string]map[string]any{}
	for _, n := range snap["sandboxes"].([]any) {
		nm := n.(map[string]any)
		nodes[fmt.Sprint(nm["sandbox_id"])] = nm
	}
	if nodes[ids[h1]]["availability"] != "unavailable" || nodes[ids[h2]]["availability"] == "unavailable" {
		t.Errorf("fleet snapshot with %s lost: %s / %s", h1, mustJSON(nodes[ids[h1]]), mustJSON(nodes[ids[h2]]))
	}
	res := c.must(t, "resources", "", map[string]any{})
	rs, _ := res["sandboxes"].(map[string]any)
	r1, _ := rs[ids[h1]].(map[string]any)
	r2, _ := rs[ids[h2]].(map[string]any)
	if r1["availability"] != "unavailable" || r2["availability"] != "available" || r2["current"] == nil {
		t.Errorf("fleet resources with %s lost: %s", h1, mustJSON(res))
	}
	// The other host is unaffected: runtime, lifecycle and placement.
	if out := c.must(t, "exec_command", ids[h2], map[string]any{"cmd": "cat shared.txt"}); !strings.Contains(fmt.Sprint(out["output"]), "ALPHA") {
		t.Errorf("exec on %s while %s is lost: %s", h2, h1, mustJSON(out))
	}
	s := c.must(t, "create_workspace_session", ids[h2], map[string]any{})
	sid := fmt.Sprint(s["workspace_session_id"])
	c.must(t, "file_write", ids[h2], map[string]any{"path": "during.txt", "content": "while h1 was away\n", "workspace_session_id": sid})
	c.must(t, "publish_workspace_session", ids[h2], map[string]any{"workspace_session_id": sid})
	imgs := c.must(t, "list_docker_images", "", map[string]any{})
	if !strings.Contains(mustJSON(imgs), testenv.Images[0]) {
		t.Errorf("list_docker_images placed on the live host: %s", mustJSON(imgs))
	}
	if st, e := c.op(t, "create_sandbox", "", map[string]any{"image": testenv.Images[0], "workspace_root": wss[h1], "host": h1}); st == http.StatusOK || e["kind"] != "operation_failed" {
		t.Errorf("create_sandbox on the lost host: HTTP %d %s", st, mustJSON(e))
	}

	// h1 comes back: its sandbox is served again with its work intact.
	c.hostCmd(t, nil, "start-engine", h1)
	c.hostCmd(t, nil, "start-worker", h1)
	clusterEventually(t, "h1's sandbox served again", func() (bool, string) {
		st, out := c.op(t, "file_read", ids[h1], map[string]any{"path": "shared.txt"})
		return st == http.StatusOK && out["content"] == "ALPHA\nbravo\ncharlie\ndelta\nECHO", mustJSON(out)
	})
	if out := c.must(t, "exec_command", ids[h1], map[string]any{"cmd": "cat w.txt"}); !strings.Contains(fmt.Sprint(out["output"]), "edited") {
		t.Errorf("exec on %s after it came back: %s", h1, mustJSON(out))
	}
	if rec := c.must(t, "inspect_sandbox", "", map[string]any{"sandbox_id": ids[h1]}); rec["availability"] == "unavailable" {
		t.Errorf("h1's sandbox still unavailable: %s", mustJSON(rec))
	}

	// Workflow links point at the cluster's UI (--temporal-ui-url).
	wv := c.must(t, "workflows", ids[h1], map[string]any{})
	if !strings.Contains(mustJSON(wv), `"ui_url":"http://temporal-ui.test:8233/namespaces/default/workflows/sandbox%2F`+ids[h1]) {
		t.Errorf("workflows view links: %s", mustJSON(wv))
	}

	// Destroy: each host's Engine is left clean.
	for _, h := range c.hosts {
		if rec := c.must(t, "destroy_sandbox", "", map[string]any{"sandbox_id": ids[h]}); rec["state"] != "stopped" {
			t.Errorf("destroy on %s: %s", h, mustJSON(rec))
		}
		if n := c.containersOn(t, h, ids[h]); len(n) != 0 {
			t.Errorf("containers left on %s: %v", h, n)
		}
	}
}

// clusterSeedFlow is the seed's flow on one sandbox: sessionless file ops,
// sessions, two disjoint publishes, a conflicting one, export, over HTTP.
func clusterSeedFlow(t *testing.T, c *cluster, host, id string) {
	fail := func(format string, a ...any) { t.Errorf("[%s] "+format, append([]any{host}, a...)...) }
	run := func(op string, args map[string]any) map[string]any {
		st, m := c.op(t, op, id, args)
		if st != http.StatusOK {
			fail("%s: HTTP %d %s", op, st, mustJSON(m))
			return map[string]any{}
		}
		return m
	}
	if out := run("exec_command", map[string]any{"cmd": "cat f.txt; echo hi > h.txt"}); !strings.Contains(fmt.Sprint(out["output"]), "base "+host) {
		fail("exec: %s", mustJSON(out))
	}
	run("file_write", map[string]any{"path": "w.txt", "content": "hello\nthere\n"})
	run("file_edit", map[string]any{"path": "w.txt", "edits": []map[string]any{{"old_string": "there", "new_string": "edited"}}})
	if rd := run("file_read", map[string]any{"path": "w.txt"}); rd["content"] != "hello\nedited" {
		fail("read after edit: %s", mustJSON(rd))
	}
	sess := func() string {
		return fmt.Sprint(run("create_workspace_session", map[string]any{})["workspace_session_id"])
	}
	s1, s2, s3 := sess(), sess(), sess()
	edit := func(s, old, new string) {
		run("file_edit", map[string]any{"workspace_session_id": s, "path": "shared.txt", "edits": []map[string]any{{"old_string": old, "new_string": new}}})
	}
	edit(s1, "alpha", "ALPHA")
	edit(s2, "echo", "ECHO")
	edit(s3, "alpha", "aleph")
	for _, s := range []string{s1, s2} {
		if p := run("publish_workspace_session", map[string]any{"workspace_session_id": s}); p["destroyed"] != true {
			fail("publish %s: %s", s, mustJSON(p))
		}
	}
	if rd := run("file_read", map[string]any{"path": "shared.txt"}); rd["content"] != "ALPHA\nbravo\ncharlie\ndelta\nECHO" {
		fail("merged shared.txt: %s", mustJSON(rd))
	}
	st, e := c.op(t, "publish_workspace_session", id, map[string]any{"workspace_session_id": s3})
	if det, _ := e["details"].(map[string]any); st == http.StatusOK || e["kind"] != "operation_failed" || !strings.Contains(mustJSON(det), "shared.txt") {
		fail("conflicting publish: HTTP %d %s", st, mustJSON(e))
	}
	run("destroy_workspace_session", map[string]any{"workspace_session_id": s3})
	dest := filepath.Join(c.work, "export-"+host)
	if st, ex := c.op(t, "export_changes", "", map[string]any{"sandbox_id": id, "dest": dest}); st != http.StatusOK || ex["format"] != "dir" {
		fail("export: HTTP %d %s", st, mustJSON(ex))
	}
	for name, want := range map[string]string{"h.txt": "hi\n", "w.txt": "hello\nedited\n", "shared.txt": "ALPHA\nbravo\ncharlie\ndelta\nECHO\n"} {
		if b, err := os.ReadFile(filepath.Join(dest, name)); err != nil || string(b) != want {
			fail("exported %s: %q %v", name, b, err)
		}
	}
}

// clusterTemporal dials the cluster's Temporal with its client
// certificate.
func clusterTemporal(t *testing.T, c *cluster) tclient.Client {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.env["TLS_CERT"], c.env["TLS_KEY"])
	if err != nil {
		t.Fatalf("cluster client certificate: %v", err)
	}
	pool := x509.NewCertPool()
	if b, err := os.ReadFile(c.env["TLS_CA"]); err != nil || !pool.AppendCertsFromPEM(b) {
		t.Fatalf("cluster CA: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := tclient.DialContext(ctx, tclient.Options{HostPort: c.env["TEMPORAL"],
		ConnectionOptions: tclient.ConnectionOptions{TLS: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}}})
	if err != nil {
		t.Fatalf("dial the cluster's Temporal: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// workflowRun is what a sandbox workflow's history says about where it
// ran and how its daemon calls went.
type workflowRun struct {
	workers                []string // identities of the workers that ran its tasks (pid@hostname@host queue)
	local, failed, regular int      // local daemon calls, of them failed; regular CallDaemon activities
	notHere                []string // local calls that failed for their host
}

// elsewhere reports whether a worker of another host than host ran it.
func (r workflowRun) elsewhere(host string) bool {
	for _, w := range r.workers {
		if !strings.HasSuffix(w, "@eos-host-"+host) { // the worker identity names its host's queue
			return true
		}
	}
	return false
}

func sandboxWorkflowRun(t *testing.T, cl tclient.Client, id string) workflowRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var r workflowRun
	seen := map[string]bool{}
	it := cl.GetWorkflowHistory(ctx, workflows.SandboxWorkflowID(id), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("history of %s: %v", id, err)
		}
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
			// (A task the server started itself carries no identity.)
			if w := ev.GetWorkflowTaskStartedEventAttributes().GetIdentity(); w != "" && !seen[w] {
				seen[w] = true
				r.workers = append(r.workers, w)
			}
		case enumspb.EVENT_TYPE_MARKER_RECORDED:
			m := ev.GetMarkerRecordedEventAttributes()
			if m.GetMarkerName() != "LocalActivity" {
				continue
			}
			r.local++
			if f := m.GetFailure(); f != nil {
				r.failed++
				if f.GetApplicationFailureInfo().GetType() == workflows.ErrTypeNotHere || strings.Contains(f.GetMessage(), "forwarder") {
					r.notHere = append(r.notHere, f.GetMessage())
				}
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			if ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == "CallDaemon" {
				r.regular++
			}
		}
	}
	sort.Strings(r.workers)
	return r
}

// clusterLocalCalls reads the histories of the sandboxes' workflows: no
// local daemon call failed for running on a worker of another host than
// its sandbox's (it goes through that host's forwarder); it logs where
// each workflow ran and how its calls went.
func clusterLocalCalls(t *testing.T, c *cluster, ids map[string]string) {
	t.Helper()
	cl := clusterTemporal(t, c)
	crossed := 0
	for h, id := range ids {
		r := sandboxWorkflowRun(t, cl, id)
		for _, f := range r.notHere {
			t.Errorf("sandbox %s (host %s): a local daemon call failed for its host: %s", id, h, f)
		}
		t.Logf("sandbox %s on %s: workflow tasks on workers %v; %d local daemon calls (%d failed), %d regular", id, h, r.workers, r.local, r.failed, r.regular)
		if r.elsewhere(h) {
			crossed++
		}
	}
	t.Logf("%d of %d sandboxes' workflows ran on a worker of another host", crossed, len(ids))
}

// clusterCrossHostCrash: the worker that runs a sandbox's workflow dies
// right after the sandbox's daemon, on another host, answered a publish
// through that host's forwarder (the side effect happened, the history
// does not know). h2's worker runs only its host's activities
// (--host-only), so h1's worker runs every workflow and h2's sandbox's
// calls cross hosts; h1's worker SIGKILLs itself after the local publish
// call succeeded (EOS_WORKER_FAILPOINT, which a call that fell back to a
// regular activity would not trip). Once h1's worker is back, the publish
// answers, committed exactly once; then both workers run as before.
func clusterCrossHostCrash(t *testing.T, c *cluster, h1, h2, id string) {
	t.Helper()
	pidOf := func(h string) int {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(c.work), "hosts", h, "worker.pid"))
		if err != nil {
			return 0
		}
		var pid int
		fmt.Sscan(string(b), &pid)
		return pid
	}
	restart := func(h string, env ...string) {
		c.hostCmd(t, nil, "stop-worker", h)
		c.hostCmd(t, env, "start-worker", h)
	}
	served := func() {
		clusterEventually(t, "h2's sandbox served", func() (bool, string) {
			st, out := c.op(t, "exec_command", id, map[string]any{"cmd": "true"})
			return st == http.StatusOK, mustJSON(out)
		})
	}
	restart(h2, "WORKER_ARGS=--host-only")
	restart(h1, worker.FailpointEnv+"=CallDaemonHere:publish_workspace_session")
	served()
	before := c.must(t, "inspect_sandbox", "", map[string]any{"sandbox_id": id})["activity_revision"].(float64)
	sid := fmt.Sprint(c.must(t, "create_workspace_session", id, map[string]any{})["workspace_session_id"])
	c.must(t, "file_write", id, map[string]any{"path": "crossed.txt", "content": "through the forwarder\n", "workspace_session_id": sid})
	dying := pidOf(h1)
	published := make(chan error, 1)
	go func() {
		st, b, err := c.g.HTTPOp("publish_workspace_session", map[string]any{"scope": map[string]any{"kind": "sandbox", "sandbox_id": id},
			"args": map[string]any{"workspace_session_id": sid}})
		if err == nil && st != http.StatusOK {
			err = fmt.Errorf("publish: HTTP %d %s", st, b)
		}
		published <- err
	}()
	// Gone: no such process, or a zombie nobody reaped yet.
	gone := func(pid int) bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || syscall.Kill(pid, 0) != nil {
			return true
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		return strings.HasPrefix(rest, "Z")
	}
	clusterEventually(t, "h1's worker killed by its failpoint after the publish's local call", func() (bool, string) {
		return dying > 0 && gone(dying), fmt.Sprint("pid ", dying)
	})
	select {
	case err := <-published:
		t.Fatalf("the publish answered while no worker could finish it: %v", err)
	default:
	}
	restart(h1)
	select {
	case err := <-published:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the publish never answered after h1's worker came back")
	}
	if after := c.must(t, "inspect_sandbox", "", map[string]any{"sandbox_id": id})["activity_revision"].(float64); after != before+1 {
		t.Errorf("publishes %v → %v: want exactly one more", before, after)
	}
	if rd := c.must(t, "file_read", id, map[string]any{"path": "crossed.txt"}); rd["content"] != "through the forwarder" {
		t.Errorf("the published file: %s", mustJSON(rd))
	}
	restart(h2)
	served()
}

// sseOp posts an op with Accept: text/event-stream and returns the whole
// stream (progress frames, then the result).
func sseOp(t *testing.T, g *testenv.Gateway, op, sandboxID string, args map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"scope": map[string]any{"kind": "sandbox", "sandbox_id": sandboxID}, "args": args})
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.Addr+"/v1/ops/"+op, strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer "+g.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := testenv.HTTPClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		sb.WriteString(sc.Text() + "\n")
	}
	return sb.String()
}

// firstEvent opens a sandbox's events stream and returns its frames up to
// the first event (the stream itself never ends).
func firstEvent(t *testing.T, g *testenv.Gateway, sandboxID string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.Addr+"/v1/sandboxes/"+sandboxID+"/events/stream?last_n=5", nil)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := testenv.HTTPClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		sb.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "data:") && strings.Contains(sb.String(), "event: event") {
			break
		}
	}
	return sb.String()
}

// TestClusterBench measures what the extra hop costs (make bench-cluster,
// in make bench): session create, exec and a small publish through the
// cluster's gateway on a sandbox of a remote host (Temporal on
// PostgreSQL, the daemon behind the host's forwarder) — one whose workflow
// runs on its own host's worker and one whose workflow runs on the other
// host's (its daemon calls through the forwarder) — beside the same on
// `make run` (a gateway with the embedded Temporal and its own workers);
// then how many sandboxes the two hosts take at once and how many
// publishes per second one cluster serves. It writes a Markdown page to
// $EOS_CLUSTER_BENCH_OUT.
func TestClusterBench(t *testing.T) {
	out := os.Getenv("EOS_CLUSTER_BENCH_OUT")
	if out == "" {
		t.Skip("make bench-cluster runs it (EOS_CLUSTER_BENCH_OUT)")
	}
	c := loadCluster(t)
	n := 20
	if s := os.Getenv("EOS_CLUSTER_BENCH_N"); s != "" {
		fmt.Sscan(s, &n)
	}
	local := testenv.StartGateway(t)
	lc := &cluster{g: local, work: testenv.TempRoot(t)}
	cl := clusterTemporal(t, c)

	// A sandbox's workflow runs on whichever host's worker takes its first
	// task: on the sandbox's own host, or on another, whose daemon calls go
	// through the forwarder of the sandbox's host. Sandboxes on the second
	// host are created until there is one of each (at most 10 tries).
	type target struct {
		name, id, host string
		c              *cluster
	}
	newSandbox := func(tc *cluster, host string) string {
		ws := filepath.Join(tc.work, "bench-ws-"+strings.ReplaceAll(client6(), "-", ""))
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(ws, "a.txt"), "a\n")
		args := map[string]any{"image": testenv.Images[0], "workspace_root": ws}
		if host != "" {
			args["host"] = host
		}
		return tc.must(t, "create_sandbox", "", args)["id"].(string)
	}
	h := c.hosts[1]
	targets := []target{{name: "make run (embedded Temporal, local daemon)", id: newSandbox(lc, ""), c: lc}}
	var own, other string
	for try := 0; try < 10 && (own == "" || other == ""); try++ {
		id := newSandbox(c, h)
		c.must(t, "exec_command", id, map[string]any{"cmd": "true"}) // its workflow has run a task by now
		switch elsewhere := sandboxWorkflowRun(t, cl, id).elsewhere(h); {
		case !elsewhere && own == "":
			own = id
		case elsewhere && other == "":
			other = id
		default:
			c.must(t, "destroy_sandbox", "", map[string]any{"sandbox_id": id})
		}
	}
	names := []string{"cluster, workflow on the sandbox's host " + h, "cluster, workflow on another host's worker (through " + h + "'s forwarder)"}
	for i, id := range []string{own, other} {
		if id == "" {
			t.Logf("no sandbox of %s had its workflow %s in 10 tries", h, map[int]string{0: "on its own host", 1: "on another host"}[i])
			continue
		}
		targets = append(targets, target{name: names[i], id: id, host: h, c: c})
	}
	ops := []string{"create_workspace_session", "exec_command", "publish (small)"}
	lat := map[string]map[string][]time.Duration{}
	runs := map[string]workflowRun{}
	for _, tg := range targets {
		id := tg.id
		lat[tg.name] = map[string][]time.Duration{}
		timed := func(op string, f func()) {
			start := time.Now()
			f()
			lat[tg.name][op] = append(lat[tg.name][op], time.Since(start))
		}
		for i := 0; i < n+2; i++ { // the first two warm up
			var sid string
			timed("create_workspace_session", func() {
				sid = fmt.Sprint(tg.c.must(t, "create_workspace_session", id, map[string]any{})["workspace_session_id"])
			})
			timed("exec_command", func() {
				tg.c.must(t, "exec_command", id, map[string]any{"cmd": "echo hi", "workspace_session_id": sid})
			})
			tg.c.must(t, "file_write", id, map[string]any{"path": fmt.Sprintf("f%d.txt", i), "content": "x\n", "workspace_session_id": sid})
			timed("publish (small)", func() { tg.c.must(t, "publish_workspace_session", id, map[string]any{"workspace_session_id": sid}) })
			if i < 2 {
				for _, op := range ops {
					lat[tg.name][op] = nil
				}
			}
		}
		if tg.c == c {
			runs[tg.name] = sandboxWorkflowRun(t, cl, id)
		}
		tg.c.must(t, "destroy_sandbox", "", map[string]any{"sandbox_id": id})
	}

	// Capacity: sandboxes created at once over both hosts, then publishes
	// per second with one agent per sandbox.
	per := 3
	if s := os.Getenv("EOS_CLUSTER_BENCH_PER_HOST"); s != "" {
		fmt.Sscan(s, &per)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var ids []string
	start := time.Now()
	for i := 0; i < per*len(c.hosts); i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ws := filepath.Join(c.work, fmt.Sprintf("cap-%d", i))
			_ = os.MkdirAll(ws, 0o755)
			writeFile(t, filepath.Join(ws, "a.txt"), "a\n")
			rec := c.must(t, "create_sandbox", "", map[string]any{"image": testenv.Images[0], "workspace_root": ws})
			mu.Lock()
			ids = append(ids, rec["id"].(string))
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	createWall := time.Since(start)
	placed := map[string]int{}
	for _, h := range c.hosts {
		for _, id := range ids {
			placed[h] += len(c.containersOn(t, h, id))
		}
	}
	pubs := 5
	start = time.Now()
	for _, id := range ids {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			for i := 0; i < pubs; i++ {
				sid := fmt.Sprint(c.must(t, "create_workspace_session", id, map[string]any{})["workspace_session_id"])
				c.must(t, "file_write", id, map[string]any{"path": fmt.Sprintf("p%d.txt", i), "content": "x\n", "workspace_session_id": sid})
				c.must(t, "publish_workspace_session", id, map[string]any{"workspace_session_id": sid})
			}
		}(id)
	}
	wg.Wait()
	pubWall := time.Since(start)
	for _, id := range ids {
		c.must(t, "destroy_sandbox", "", map[string]any{"sandbox_id": id})
	}

	var b strings.Builder
	fmt.Fprintf(&b, "# The cluster's extra hop (%s)\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Measured by `make bench-cluster` (TestClusterBench) on this machine: the cluster of `make test-cluster` "+
		"(Temporal server on PostgreSQL, two Docker hosts in network namespaces, one `sandbox-gateway --no-workers`) beside "+
		"`make run` (embedded Temporal, in-process workers), both on the same %d-core machine, %d samples per op after 2 warm-ups, "+
		"sequential, over HTTP. A sandbox's workflow runs on whichever host's worker takes it; one of each kind is measured.\n\n", runtimeCPUs(), n)
	b.WriteString("| op |")
	for _, tg := range targets {
		fmt.Fprintf(&b, " %s p50 | p90 |", tg.name)
		if tg.c == c {
			b.WriteString(" ratio to make run (p50) |")
		}
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", 2*len(targets)+len(targets)-1) + "\n")
	for _, op := range ops {
		fmt.Fprintf(&b, "| %s |", op)
		base := pct(lat[targets[0].name][op], 50)
		for _, tg := range targets {
			l := lat[tg.name][op]
			fmt.Fprintf(&b, " %s | %s |", ms(pct(l, 50)), ms(pct(l, 90)))
			if tg.c == c {
				fmt.Fprintf(&b, " %.2f× |", float64(pct(l, 50))/float64(max(base, 1)))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\nWhere each cluster sandbox's workflow ran (its history: the workers that ran its tasks; its daemon calls " +
		"as local activities, failed ones among them, and regular CallDaemon activities):\n\n")
	for _, tg := range targets[1:] {
		r := runs[tg.name]
		fmt.Fprintf(&b, "- %s: workers %v; %d local daemon calls (%d failed), %d regular.\n", tg.name, r.workers, r.local, r.failed, r.regular)
	}
	fmt.Fprintf(&b, "\nCapacity through the one cluster: %d sandboxes created at once (least-loaded placement put %v) in %s "+
		"(%.2f sandboxes/s); then one agent per sandbox, %d publishes each (session, write, publish): %d publishes in %s = **%.1f publishes/s**.\n",
		len(ids), placed, createWall.Round(time.Millisecond), float64(len(ids))/createWall.Seconds(), pubs, pubs*len(ids),
		pubWall.Round(time.Millisecond), float64(pubs*len(ids))/pubWall.Seconds())
	t.Log("\n" + b.String())
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (p*len(s)+99)/100 - 1
	return s[max(i, 0)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func runtimeCPUs() int { return runtime.NumCPU() }

func client6() string { return fmt.Sprint(time.Now().UnixNano()) }

func healthz(t *testing.T, g *testenv.Gateway) map[string]any {
	t.Helper()
	_, b, err := g.Get("/healthz", g.Token)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("/healthz: %v: %s", err, b)
	}
	return m
}
