package sandboxinit

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serveViewDaemon serves a daemon over a base of one file on a real
// loopback listener until the test ends.
func serveViewDaemon(t *testing.T) (*Daemon, net.Listener) {
	t.Helper()
	d := newViewDaemon(t, map[string]string{"a": "a\n"})
	srv := NewServer(d)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.http.Close() })
	return d, l
}

// TestDaemonRefusesForeignHost: over a real listener, the daemon answers
// a loopback Host (whatever the port) and refuses a name such as
// evil.example (DNS rebinding) before authentication, with no CORS grant.
func TestDaemonRefusesForeignHost(t *testing.T) {
	_, l := serveViewDaemon(t)
	_, port, _ := net.SplitHostPort(l.Addr().String())
	cl := &http.Client{Timeout: 10 * time.Second}
	for host, want := range map[string]int{
		"127.0.0.1:" + port:    http.StatusOK,
		"127.0.0.1:49153":      http.StatusOK, // the port Docker published, not the one inside
		"localhost:7001":       http.StatusOK,
		"[::1]:7001":           http.StatusOK,
		"evil.example":         http.StatusMisdirectedRequest,
		"evil.example:" + port: http.StatusMisdirectedRequest,
		"10.0.0.5:" + port:     http.StatusMisdirectedRequest,
	} {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/health", l.Addr()), nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Origin", "http://evil.example")
		resp, err := cl.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, host)
		require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), host)
	}
}

// TestInFlightByOp: /health's in_flight_ops counts each request being
// served under its operation until it ends, and drops an operation with
// none left.
func TestInFlightByOp(t *testing.T) {
	var f inFlight
	a1, a2, b := f.begin("publish_workspace_session"), f.begin("publish_workspace_session"), f.begin("exec_command")
	require.Equal(t, 3, f.total())
	require.Equal(t, map[string]int{"publish_workspace_session": 2, "exec_command": 1}, f.byOp())
	a1()
	b()
	require.Equal(t, 1, f.total())
	require.Equal(t, map[string]int{"publish_workspace_session": 1}, f.byOp())
	a2()
	require.Equal(t, 0, f.total())
	require.Equal(t, map[string]int{}, f.byOp(), "an empty object, not null")
}

// TestRequestsInTheDaemonView: the daemon view (every door's, not only the
// daemon port's /health) says what the daemon is serving, by operation.
func TestRequestsInTheDaemonView(t *testing.T) {
	d := newViewDaemon(t, map[string]string{"a": "a\n"})
	requests := func() map[string]any {
		return d.obs.DaemonView()["daemon"].(map[string]any)["requests"].(map[string]any)
	}
	require.Equal(t, map[string]any{"in_flight": 0, "in_flight_ops": map[string]int{}}, requests())
	end := d.inflight.begin("publish_workspace_session")
	require.Equal(t, map[string]any{"in_flight": 1, "in_flight_ops": map[string]int{"publish_workspace_session": 1}}, requests())
	end()
	require.Equal(t, 0, requests()["in_flight"])
}

// TestInFlightOpsTakeNoHostileNames: over a real listener, requests for
// operations that do not exist (made-up, 8 KiB long, path tricks), a wrong
// token, and a real operation with a malformed body each get a structured
// 4xx and leave nothing counted once answered (no error path skips the
// count's end). serveRPC refuses an unknown operation before it counts
// anything, so in_flight_ops names only operations the daemon has.
func TestInFlightOpsTakeNoHostileNames(t *testing.T) {
	d, l := serveViewDaemon(t)
	cl := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, fmt.Sprintf("http://%s%s", l.Addr(), path), strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := cl.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ path, token, body string }{
		{"/rpc/no_such_op", testToken, "{}"},
		{"/rpc/" + strings.Repeat("x", 8192), testToken, "{}"},
		{"/rpc/..%2fhealth", testToken, "{}"},
		{"/rpc/publish_workspace_session", "wrong-token", "{}"},
		{"/rpc/publish_workspace_session", testToken, "{not json"},
	} {
		st, body := do(http.MethodPost, c.path, c.token, c.body)
		require.True(t, st >= 400 && st < 500, "%.60s: %d %s", c.path, st, body)
		require.Contains(t, body, `"error"`, "a structured error: %.60s", c.path)
	}
	st, body := do(http.MethodGet, "/health", testToken, "")
	require.Equal(t, http.StatusOK, st)
	require.Contains(t, body, `"in_flight":0`)
	require.Contains(t, body, `"in_flight_ops":{}`)
	require.Equal(t, map[string]int{}, d.inflight.byOp())
}
