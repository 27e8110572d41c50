package hostlink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
)

// fakeDaemon answers /rpc/echo with its args, /rpc/stream with NDJSON
// lines then a result, and checks the token and the loopback Host as the
// real daemon does.
func fakeDaemon(t *testing.T, secret []byte, id string) (*httptest.Server, *atomic.Int64) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+daemonclient.Token(secret, id) {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(api.Envelope{Error: api.Errorf(api.KindUnauthorized, nil, "bad token")})
			return
		}
		if !strings.HasPrefix(r.Host, "127.0.0.1:") {
			http.Error(w, "host check", http.StatusForbidden)
			return
		}
		switch r.URL.Path {
		case "/rpc/echo":
			var v map[string]any
			if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
				http.Error(w, "bad json: "+err.Error(), http.StatusBadRequest)
				return
			}
			v["request_id"] = r.Header.Get("X-Request-Id")
			_ = json.NewEncoder(w).Encode(v)
		case "/rpc/stream":
			w.Header().Set("Content-Type", api.ContentTypeNDJSON)
			f := w.(http.Flusher)
			for i := range 3 {
				fmt.Fprintf(w, `{"line":{"stream":"stdout","text":"line %d"}}`+"\n", i)
				f.Flush()
			}
			fmt.Fprintln(w, `{"result":{"exit_code":0}}`)
		case "/rpc/refuse":
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(api.Envelope{Error: api.Errorf(api.KindConflict, map[string]any{"path": "a"}, "conflict on a")})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func endpointOf(t *testing.T, url string) api.Endpoint {
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	p, _ := strconv.Atoi(port)
	return api.Endpoint{Host: "127.0.0.1", Port: p}
}

type fixture struct {
	secret []byte
	id     string
	addr   string
	cert   Cert
	daemon *httptest.Server
	calls  *atomic.Int64
	ep     api.Endpoint
}

func start(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{secret: []byte("deployment secret"), id: "eos-1234"}
	f.daemon, f.calls = fakeDaemon(t, f.secret, f.id)
	f.ep = endpointOf(t, f.daemon.URL)
	cert, err := LoadOrCreateCert(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	f.cert = cert
	s := &Server{Secret: f.secret, Host: "h1", Lookup: func(_ context.Context, id string) (api.Endpoint, error) {
		if id != f.id {
			return api.Endpoint{}, api.Errorf(api.KindNotFound, map[string]any{"sandbox_id": id}, "sandbox %s is not one of this host's", id)
		}
		return f.ep, nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addr, _, err := Listen(ctx, "127.0.0.1:0", cert, s)
	if err != nil {
		t.Fatal(err)
	}
	f.addr = addr.String()
	return f
}

func (f *fixture) via() *daemonclient.Via {
	return &daemonclient.Via{Addr: f.addr, Fingerprint: f.cert.Fingerprint}
}

func TestForwardCallsAndStreams(t *testing.T) {
	f := start(t)
	c := daemonclient.New(f.secret, nil)
	ctx := context.Background()
	out, _, err := c.Do(ctx, daemonclient.Call{SandboxID: f.id, Endpoint: api.Endpoint{Port: 1}, Op: "echo", Args: json.RawMessage(`{"a":1}`),
		RequestID: "req-1", Via: f.via()})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("echo through the forwarder: %v: %s", err, out)
	}
	if got["a"] != float64(1) || got["request_id"] != "req-1" {
		t.Fatalf("echo through the forwarder: %s", out)
	}
	var lines []string
	out, _, err = c.Do(ctx, daemonclient.Call{SandboxID: f.id, Endpoint: api.Endpoint{Port: 1}, Op: "stream", Via: f.via(),
		Progress: func(l api.OutputLine) { lines = append(lines, l.Text) }})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(lines, ",") != "line 0,line 1,line 2" || !strings.Contains(string(out), `"exit_code":0`) {
		t.Fatalf("stream through the forwarder: lines %q result %s", lines, out)
	}
	// The daemon's refusal comes back as it was sent.
	_, _, err = c.Do(ctx, daemonclient.Call{SandboxID: f.id, Endpoint: api.Endpoint{Port: 1}, Op: "refuse", Via: f.via()})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Kind != api.KindConflict || ae.Details["path"] != "a" {
		t.Fatalf("refusal through the forwarder: %v", err)
	}
	var fe *daemonclient.ForwarderError
	if errors.As(err, &fe) {
		t.Fatalf("the daemon's refusal is marked as the forwarder's: %v", err)
	}
}

func TestForwarderRefusesStrangers(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	before := f.calls.Load()

	// Another deployment's secret: its token for the same id is not this one's.
	other := daemonclient.New([]byte("another deployment"), nil)
	_, _, err := other.Do(ctx, daemonclient.Call{SandboxID: f.id, Endpoint: api.Endpoint{Port: 1}, Op: "echo", Via: f.via()})
	var ae *api.Error
	var fe *daemonclient.ForwarderError
	if !errors.As(err, &ae) || ae.Kind != api.KindUnauthorized || !errors.As(err, &fe) {
		t.Fatalf("foreign token: want the forwarder's own unauthorized, got %v", err)
	}
	// A sandbox not on this host, with its own valid token.
	c := daemonclient.New(f.secret, nil)
	_, _, err = c.Do(ctx, daemonclient.Call{SandboxID: "eos-elsewhere", Endpoint: api.Endpoint{Port: 1}, Op: "echo", Via: f.via()})
	if !errors.As(err, &ae) || ae.Kind != api.KindNotFound || !errors.As(err, &fe) {
		t.Fatalf("sandbox of another host: want the forwarder's own not_found, got %v", err)
	}
	// A forwarder whose certificate is not the pinned one is never sent
	// the token.
	wrong := &daemonclient.Via{Addr: f.addr, Fingerprint: strings.Repeat("0", 64)}
	_, _, err = c.Do(ctx, daemonclient.Call{SandboxID: f.id, Endpoint: api.Endpoint{Port: 1}, Op: "echo", Via: wrong})
	if !daemonclient.IsConn(err) || !strings.Contains(err.Error(), "not the pinned") {
		t.Fatalf("wrong pin: %v", err)
	}
	if n := f.calls.Load(); n != before {
		t.Fatalf("the daemon saw %d requests it must not have", n-before)
	}

	// Hostile paths and ids, by hand.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: daemonclient.PinnedTLS(f.cert.Fingerprint)}}
	for _, p := range []string{"/v1/daemon/" + f.id + "/debug/pprof/", "/v1/daemon/" + f.id + "/rpc/../health", "/v1/daemon/..%2f/rpc/echo",
		"/v1/daemon/-bad/rpc/echo", "/other"} {
		req, _ := http.NewRequest(http.MethodPost, "https://"+f.addr+p, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+daemonclient.Token(f.secret, f.id))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: HTTP %d", p, resp.StatusCode)
		}
	}
	if n := f.calls.Load(); n != before {
		t.Fatalf("the daemon saw %d hostile requests", n-before)
	}
}

func TestForwarderRefusedDialIsARefusedConnection(t *testing.T) {
	f := start(t)
	f.daemon.Close() // the container stopped: its port refuses
	c := daemonclient.New(f.secret, nil)
	_, _, err := c.Do(context.Background(), daemonclient.Call{SandboxID: f.id, Endpoint: api.Endpoint{Port: 1}, Op: "echo", Via: f.via()})
	var ce *daemonclient.ConnError
	if !errors.As(err, &ce) || !ce.Refused {
		t.Fatalf("want a refused ConnError, got %v", err)
	}
}

func TestCertIsKept(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreateCert(dir, []string{"10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateCert(dir, []string{"10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Fingerprint != b.Fingerprint || len(a.Fingerprint) != 64 {
		t.Fatalf("fingerprints %s, %s", a.Fingerprint, b.Fingerprint)
	}
}

// The state route serves the copy of a sandbox's state that the host's
// worker holds, to the sandbox's token only, when it is of the asked run
// and has seen the asked history (204 otherwise); hostile ids and
// parameters are refused before the token is even checked.
func TestForwarderServesStateCopies(t *testing.T) {
	f := start(t)
	srvState := func(id, run string, n int64) ([]byte, bool) {
		if id == f.id && run == "run-1" && n <= 40 {
			return []byte(`{"sandbox_id":"` + id + `","publishes":7}`), true
		}
		return nil, false
	}
	// start() serves a Server without State: a second one with it.
	s := &Server{Secret: f.secret, Host: "h1", State: srvState, Lookup: func(context.Context, string) (api.Endpoint, error) { return f.ep, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addr, _, err := Listen(ctx, "127.0.0.1:0", f.cert, s)
	if err != nil {
		t.Fatal(err)
	}
	via := &daemonclient.Via{Addr: addr.String(), Fingerprint: f.cert.Fingerprint}
	c := daemonclient.New(f.secret, nil)
	raw, ok, err := c.MirroredState(context.Background(), via, f.id, "run-1", 40)
	if err != nil || !ok || !strings.Contains(string(raw), `"publishes":7`) {
		t.Fatalf("a current copy: %s %v %v", raw, ok, err)
	}
	for _, ask := range []struct {
		run string
		n   int64
	}{{"run-1", 41}, {"run-2", 40}} {
		if raw, ok, err := c.MirroredState(context.Background(), via, f.id, ask.run, ask.n); err != nil || ok || raw != nil {
			t.Fatalf("no copy that new (%v): %s %v %v", ask, raw, ok, err)
		}
	}
	// Without State (start's server): none.
	if _, ok, err := c.MirroredState(context.Background(), f.via(), f.id, "run-1", 40); err != nil || ok {
		t.Fatalf("a forwarder without copies: %v %v", ok, err)
	}
	// Another deployment's token.
	other := daemonclient.New([]byte("another deployment"), nil)
	var ae *api.Error
	if _, _, err := other.MirroredState(context.Background(), via, f.id, "run-1", 40); !errors.As(err, &ae) || ae.Kind != api.KindUnauthorized {
		t.Fatalf("foreign token: %v", err)
	}
	// Hostile requests, by hand.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: daemonclient.PinnedTLS(f.cert.Fingerprint)}}
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/v1/state/" + f.id},
		{http.MethodGet, "/v1/state/" + f.id + "?run_id=run-1&history_length=0"},
		{http.MethodGet, "/v1/state/" + f.id + "?run_id=run-1&history_length=x"},
		{http.MethodGet, "/v1/state/" + f.id + "?run_id=../x&history_length=4"},
		{http.MethodGet, "/v1/state/..%2fx?run_id=run-1&history_length=4"},
		{http.MethodGet, "/v1/state/" + f.id + "/more?run_id=run-1&history_length=4"},
		{http.MethodPost, "/v1/state/" + f.id + "?run_id=run-1&history_length=4"},
	} {
		req, _ := http.NewRequest(r.method, "https://"+addr.String()+r.path, nil)
		req.Header.Set("Authorization", "Bearer "+daemonclient.Token(f.secret, f.id))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s %s: HTTP %d", r.method, r.path, resp.StatusCode)
		}
	}
}
