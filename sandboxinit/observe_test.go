package sandboxinit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// These tests run the daemon in process without its session runtime
// (libcontainer needs the sandbox container): sessions are records with an
// upper dir and a lease, which is all publish and the views need. They need
// root for the layer store's overlay probe (make test runs as root).

const testToken = "0123456789abcdef0123456789abcdef"

func newViewDaemon(t *testing.T, base map[string]string) *Daemon {
	t.Helper()
	return openTestDaemon(t, t.TempDir(), base, func(c *Config) {
		c.SampleInterval, c.SampleIdleAfter = 20*time.Millisecond, 150*time.Millisecond
	})
}

// fakeSession registers a session without a runtime whose upper dir holds
// files (path -> content).
func fakeSession(t *testing.T, d *Daemon, id, agent string, files map[string]string) *session {
	t.Helper()
	s := &session{state: StateActive, rec: sessionRecord{ID: id, NetworkProfile: "shared", Agent: agent, Upper: "upper-0", Created: time.Now().UTC()}}
	s.dir = filepath.Join(d.cfg.StateDir, "sessions", id)
	lease, err := d.store.Acquire(s.owner())
	require.NoError(t, err)
	s.rec.LeaseID = lease.ID
	for p, c := range files {
		full := filepath.Join(s.upper(), p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(c), 0o644))
	}
	require.NoError(t, os.MkdirAll(s.merged(), 0o755))
	s.act.touch()
	d.mu.Lock()
	d.sessions[id] = s
	d.mu.Unlock()
	return s
}

// rpc calls the daemon's HTTP handler in process.
func rpc(t testing.TB, h http.Handler, rid, op string, args any) (int, map[string]any) {
	t.Helper()
	body, err := json.Marshal(args)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/rpc/"+op, bytes.NewReader(body))
	req.Host = "127.0.0.1:32768" // the gateway reaches the daemon at its published loopback port
	req.Header.Set("Authorization", "Bearer "+testToken)
	if rid != "" {
		req.Header.Set("X-Request-Id", rid)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var out map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out), "%s: %s", op, w.Body.String())
	return w.Code, out
}

func lines(n int, f func(i int) string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(f(i) + "\n")
	}
	return b.String()
}

// scenario publishes a clean change, a merge and a conflict from three
// sessions, and one sessionless write; a fourth session stays live.
func scenario(t *testing.T) (*Daemon, http.Handler) {
	t.Helper()
	plain := func(i int) string { return "line " + string(rune('0'+i%10)) }
	d := newViewDaemon(t, map[string]string{"f.txt": lines(10, plain), "g.txt": "g\n"})
	h := NewServer(d).http.Handler
	edit := func(at int, text string) string {
		return lines(10, func(i int) string {
			if i == at {
				return text
			}
			return plain(i)
		})
	}
	fakeSession(t, d, "ws-a", "alice", map[string]string{"f.txt": edit(2, "TWO"), "new/a.txt": "a\n"})
	fakeSession(t, d, "ws-b", "bob", map[string]string{"f.txt": edit(8, "EIGHT")})
	fakeSession(t, d, "ws-c", "carol", map[string]string{"f.txt": edit(2, "two, differently")})
	fakeSession(t, d, "ws-d", "dave", map[string]string{"d.txt": "unpublished\n"})

	code, out := rpc(t, h, "rid-pub-a", "publish_workspace_session", map[string]any{"workspace_session_id": "ws-a", "message": "alice's change"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = rpc(t, h, "rid-pub-b", "publish_workspace_session", map[string]any{"workspace_session_id": "ws-b"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.Equal(t, []any{"f.txt"}, out["publish"].(map[string]any)["merged_paths"])
	code, out = rpc(t, h, "rid-pub-c", "publish_workspace_session", map[string]any{"workspace_session_id": "ws-c"})
	require.Equal(t, http.StatusConflict, code, "%v", out)
	code, out = rpc(t, h, "rid-write", "file_write", map[string]any{"path": "notes.md", "content": "hi\n"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	return d, h
}

func TestObservabilityViews(t *testing.T) {
	d, h := scenario(t)
	call := func(op string, args map[string]any) map[string]any {
		if args == nil {
			args = map[string]any{}
		}
		code, out := rpc(t, h, "", op, args)
		require.Equal(t, http.StatusOK, code, "%s: %v", op, out)
		return out
	}
	testenv.CheckObservabilityViews(t, call)

	snap := call("snapshot", map[string]any{"sandbox_id": "eos-from-gateway"})
	require.Equal(t, "eos-from-gateway", snap["sandbox_id"], "the gateway's sandbox_id wins")
	require.Equal(t, "eos-test", call("snapshot", nil)["sandbox_id"], "else the configured one")
	require.Equal(t, "ready", snap["lifecycle_state"])
	require.Len(t, snap["workspaces"], 2, "ws-c (retained after its conflict) and ws-d")
	stack := snap["stack"].(map[string]any)
	require.EqualValues(t, 4, stack["layer_count"], "base, alice, bob, the sessionless write")
	require.EqualValues(t, 2, stack["active_leases"])

	// The trace of bob's publish: dispatch > publish > capture, commit, finalize.
	tr := call("trace", map[string]any{"trace_id": "rid-pub-b"})
	require.Equal(t, "rid-pub-b", tr["trace"])
	spans := tr["spans"].([]any)
	require.Len(t, spans, 1)
	root := spans[0].(map[string]any)
	require.Equal(t, "daemon.dispatch", root["span"].(map[string]any)["name"])
	require.Equal(t, "publish_workspace_session", root["span"].(map[string]any)["attrs"].(map[string]any)["op"])
	pub := root["children"].([]any)[0].(map[string]any)
	require.Equal(t, "workspace_session.publish", pub["span"].(map[string]any)["name"])
	var names []string
	for _, c := range pub["children"].([]any) {
		names = append(names, c.(map[string]any)["span"].(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"workspace_session.capture_changes", "layerstack.publish", "workspace_session.finalize"}, names)
	var evNames []string
	for _, e := range pub["events"].([]any) {
		evNames = append(evNames, e.(map[string]any)["event"].(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"workspace_session.published"}, evNames)
	fin := pub["children"].([]any)[2].(map[string]any)
	require.Equal(t, "lease.released", fin["events"].([]any)[0].(map[string]any)["event"].(map[string]any)["name"])
	require.GreaterOrEqual(t, fin["offset_ms"].(float64), pub["offset_ms"].(float64))
	require.Equal(t, "rid-write", call("trace", nil)["trace"], "last is the newest request")

	// Events: newest first, filtered by name and since.
	evs := call("events", map[string]any{"name": "workspace_session.published"})["events"].([]any)
	require.Len(t, evs, 2)
	require.Equal(t, "rid-pub-b", evs[0].(map[string]any)["trace"], "newest first")
	ts, err := time.Parse(time.RFC3339Nano, evs[0].(map[string]any)["ts"].(string))
	require.NoError(t, err, "ts is RFC 3339")
	require.Empty(t, call("events", map[string]any{"since_ms": ts.UnixMilli(), "name": "workspace_session.published"})["events"])
	require.Len(t, call("events", map[string]any{"last_n": 1})["events"], 1)

	// Who published what: newest first, merge and conflict with agents.
	hist := call("publish_history", nil)["publishes"].([]any)
	require.Len(t, hist, 4)
	row := func(i int) map[string]any { return hist[i].(map[string]any) }
	require.Equal(t, "sessionless", row(0)["source"])
	require.Equal(t, "clean", row(0)["outcome"])
	require.Equal(t, []any{"notes.md"}, row(0)["paths"])
	require.Equal(t, "conflict", row(1)["outcome"])
	require.Equal(t, "carol", row(1)["agent"])
	require.Equal(t, "f.txt", row(1)["conflicts"].([]any)[0].(map[string]any)["path"])
	require.Equal(t, "", row(1)["layer_id"])
	require.Equal(t, "merged", row(2)["outcome"])
	require.Equal(t, "bob", row(2)["agent"])
	require.Equal(t, "rid-pub-b", row(2)["trace"])
	require.NotEmpty(t, row(2)["layer_id"])
	require.Equal(t, "clean", row(3)["outcome"])
	require.Equal(t, "alice", row(3)["agent"])
	require.Equal(t, "alice's change", row(3)["message"])
	require.EqualValues(t, 3, row(3)["path_count"], "f.txt, new, new/a.txt")
	only := call("publish_history", map[string]any{"workspace_session_id": "ws-c"})["publishes"].([]any)
	require.Len(t, only, 1)
	require.Len(t, call("publish_history", map[string]any{"limit": 1})["publishes"], 1)

	// Layer views.
	ls := call("layerstack", nil)
	layers := ls["layers"].([]any)
	require.Equal(t, []any{"operation:rid-write"}, layers[0].(map[string]any)["booked_by"], "newest first")
	base := layers[len(layers)-1].(map[string]any)
	require.ElementsMatch(t, []any{"ws-c", "ws-d"}, base["leased_by_workspaces"])
	ws := call("layerstack", map[string]any{"workspace_id": "ws-d"})
	require.EqualValues(t, len("unpublished\n"), ws["upper_bytes"])
	require.Equal(t, []any{"ws-c"}, ws["mounts"].([]any)[0].(map[string]any)["shared_with"])
	alice := layers[2].(map[string]any)["layer_id"]
	ents := call("layerstack", map[string]any{"layer_id": alice})
	require.Equal(t, []any{map[string]any{"path": "f.txt", "kind": "file"}, map[string]any{"path": "new", "kind": "directory"},
		map[string]any{"path": "new/a.txt", "kind": "file"}}, ents["entries"])
	require.Len(t, call("layerstack", map[string]any{"layer_id": alice, "limit": 1})["entries"], 1)
	require.Equal(t, true, call("layerstack", map[string]any{"layer_id": alice, "limit": 1})["truncated"])
	code, _ := rpc(t, h, "", "layerstack", map[string]any{"layer_id": "L-nope"})
	require.Equal(t, http.StatusNotFound, code)
	code, _ = rpc(t, h, "", "cgroup", map[string]any{"scope": "ws-nope"})
	require.Equal(t, http.StatusNotFound, code)
	code, _ = rpc(t, h, "", "snapshot", map[string]any{"bogus": 1})
	require.Equal(t, http.StatusBadRequest, code, "unknown arguments are refused")
	_ = d
}

// fingerprint maps every file under dir to its size and sha256.
func fingerprint(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !de.Type().IsRegular() {
			out[p] = de.Type().String()
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		out[p] = fmt.Sprintf("%d bytes, sha256 %s", len(b), hex.EncodeToString(sum[:]))
		return nil
	}))
	return out
}

func heapAfterGC() uint64 {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestViewsChangeNothing: a sandbox that is only looked at does no
// observability work. 1000 rounds of every view leave every file of the
// state volume byte for byte unchanged, never wake the sampler, and keep
// the heap flat.
func TestViewsChangeNothing(t *testing.T) {
	d, h := scenario(t)
	require.Eventually(t, func() bool { return d.obs.Store.Samples.Stats().Appended > 0 }, 10*time.Second, 5*time.Millisecond,
		"requests wake the sampler")
	require.Eventually(t, func() bool { return !d.obs.Sampler.Stats().Running }, 10*time.Second, 5*time.Millisecond,
		"the sampler stops once idle")
	samples := d.obs.Store.Samples.Stats().Appended
	require.Never(t, func() bool { return d.obs.Store.Samples.Stats().Appended != samples }, 200*time.Millisecond, 10*time.Millisecond,
		"no sample while idle")

	views := []struct {
		op   string
		args map[string]any
	}{
		{"snapshot", nil}, {"trace", map[string]any{"trace_id": "last"}}, {"trace", map[string]any{"trace_id": "rid-pub-b"}},
		{"events", map[string]any{"last_n": 500}}, {"resources", map[string]any{"window_ms": 600000}}, {"daemon", nil},
		{"topology", nil}, {"cgroup", map[string]any{"scope": "sandbox"}}, {"cgroup", map[string]any{"scope": "ws-d"}},
		{"layerstack", nil}, {"layerstack", map[string]any{"workspace_id": "ws-d"}}, {"publish_history", nil},
		{"health", nil}, {"layerstack_history", nil},
	}
	round := func() {
		for _, v := range views {
			args := v.args
			if args == nil {
				args = map[string]any{}
			}
			code, out := rpc(t, h, "", v.op, args)
			if code != http.StatusOK {
				t.Fatalf("%s: %d %v", v.op, code, out)
			}
		}
	}
	for i := 0; i < 20; i++ { // warm caches (layer sizes) and pools
		round()
	}
	before := fingerprint(t, d.cfg.StateDir)
	starts := d.obs.Sampler.Stats().Starts
	heap0 := heapAfterGC()
	start := time.Now()
	for i := 0; i < 1000; i++ {
		round()
	}
	elapsed := time.Since(start)
	heap1 := heapAfterGC()
	require.Equal(t, before, fingerprint(t, d.cfg.StateDir), "reading views changed the state volume")
	require.Equal(t, starts, d.obs.Sampler.Stats().Starts, "reading views woke the sampler")
	require.Less(t, int64(heap1)-int64(heap0), int64(1<<20), "heap grew from %d to %d bytes", heap0, heap1)
	t.Logf("1000 rounds of %d views in %s; heap %d -> %d bytes", len(views), elapsed, heap0, heap1)
}

// Every RPC answer, refusals too, says in its Server-Timing header how long
// the daemon took over it.
func TestAnswersCarryTheDaemonsTime(t *testing.T) {
	d := newViewDaemon(t, map[string]string{"f.txt": "x\n"})
	h := NewServer(d).http.Handler
	fakeSession(t, d, "ws-a", "alice", map[string]string{"a.txt": "a\n"})
	for _, c := range []struct {
		op   string
		args any
		code int
	}{
		{"list_workspace_sessions", map[string]any{}, http.StatusOK},
		{"publish_workspace_session", map[string]any{"workspace_session_id": "ws-a"}, http.StatusOK},
		{"file_read", map[string]any{"workspace_session_id": "nope", "path": "f.txt"}, http.StatusNotFound},
	} {
		body, err := json.Marshal(c.args)
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, "/rpc/"+c.op, bytes.NewReader(body))
		req.Host = "127.0.0.1:32768"
		req.Header.Set("Authorization", "Bearer "+testToken)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, c.code, w.Code, w.Body.String())
		st := api.ParseServerTiming(w.Header().Get(api.ServerTimingHeader))
		dur, ok := st.Get(api.TimingDaemon)
		require.True(t, ok, "header %q", w.Header().Get(api.ServerTimingHeader))
		require.Greater(t, dur, time.Duration(0))
		require.Less(t, dur, time.Minute)
	}
}
