package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serve starts busybox httpd in session ws on port, serving who.txt = name.
func (sb *sandbox) serve(ws string, port int, name string) {
	sb.t.Helper()
	dir := fmt.Sprintf("www-%d", port)
	sb.exec(ws, fmt.Sprintf("mkdir -p %s && echo %s > %s/who.txt", dir, name, dir))
	out := sb.ok("exec_command", map[string]any{"cmd": fmt.Sprintf("busybox httpd -f -p %d -h %s", port, dir), "workspace_session_id": ws, "yield_time_ms": 300})
	require.Equal(sb.t, "running", out["status"], "httpd on %d: %v", port, out)
	// Serving before it returns: a check that it cannot be reached from
	// elsewhere would otherwise prove nothing.
	require.Eventually(sb.t, func() bool { return sb.fetch(ws, fmt.Sprintf("127.0.0.1:%d", port)) == name }, 20*time.Second, 100*time.Millisecond,
		"httpd on %d in %s never served", port, ws)
}

// fetch GETs who.txt from addr (host:port) in session ws with busybox nc
// and returns the body, or "" when the connection failed (refused, or no
// answer within 2 s).
func (sb *sandbox) fetch(ws, addr string) string {
	sb.t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(sb.t, err)
	out := sb.exec(ws, fmt.Sprintf(`r=$(printf 'GET /who.txt HTTP/1.0\r\n\r\n' | busybox nc -w 2 %s %s 2>&1) && echo "$r" | tail -n 1`, host, port))
	s, _ := out["output"].(string)
	sb.t.Logf("GET %s in %s: %q (exit %v)", addr, ws, s, out["exit_code"])
	if out["exit_code"] != float64(0) {
		return ""
	}
	return strings.TrimSpace(s)
}

// isolatedSession creates an isolated session with args and returns its id,
// its address and its gateway (the sandbox's end of its veth).
func (sb *sandbox) isolatedSession(args map[string]any) (id, ip, gw string, info map[string]any) {
	sb.t.Helper()
	args["network_profile"] = "isolated"
	info = sb.ok("create_workspace_session", args)
	id, _ = info["workspace_session_id"].(string)
	ip, _ = info["ip"].(string)
	a, err := netip.ParseAddr(ip)
	require.NoError(sb.t, err, "isolated session without an ip: %v", info)
	return id, ip, a.Prev().String(), info
}

// Two isolated sessions never reach each other's servers, nor does a shared
// session, while each still reaches the sandbox (a shared session's server)
// through its gateway and the daemon still forwards to both.
func TestIsolatedSessionsCannotReachEachOther(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	shared := sb.session(nil)
	sb.serve(shared, 8081, "shared")
	a, ipA, gwA, _ := sb.isolatedSession(map[string]any{})
	b, ipB, _, _ := sb.isolatedSession(map[string]any{})
	sb.serve(a, 8080, "A")
	sb.serve(b, 8080, "B")

	require.Eventually(t, func() bool { return sb.fetch(a, gwA+":8081") == "shared" }, 10*time.Second, 200*time.Millisecond,
		"an isolated session reaches the sandbox through its gateway")
	require.Equal(t, "A", sb.fetch(a, "127.0.0.1:8080"), "its own server")
	require.Empty(t, sb.fetch(shared, ipB+":8080"), "a shared session reached an isolated session's server")
	require.Empty(t, sb.fetch(a, ipB+":8080"), "session A reached session B's server")
	require.Empty(t, sb.fetch(b, ipA+":8080"), "session B reached session A's server")
	for ws, want := range map[string]string{a: "A\n", b: "B\n"} {
		require.Equal(t, want, sb.forward(ws, 8080))
	}
}

// egress none blocks everything a session starts; an allow-list lets only
// its cidr:port through; the policy shows in the session's info and in the
// snapshot; a shared session cannot have one.
func TestSessionEgressPolicy(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	shared := sb.session(nil)
	sb.serve(shared, 8001, "one")
	sb.serve(shared, 8002, "two")

	open, _, gwOpen, info := sb.isolatedSession(map[string]any{})
	require.Equal(t, "default", info["egress"])
	require.Eventually(t, func() bool { return sb.fetch(open, gwOpen+":8001") == "one" }, 10*time.Second, 200*time.Millisecond)
	require.Equal(t, "two", sb.fetch(open, gwOpen+":8002"))

	none, _, gwNone, info := sb.isolatedSession(map[string]any{"egress": "none"})
	require.Equal(t, "none", info["egress"])
	require.Empty(t, sb.fetch(none, gwNone+":8001"), "egress none reached the sandbox")
	require.Empty(t, sb.fetch(none, gwNone+":8002"), "egress none reached the sandbox")
	require.Equal(t, "none\n", func() string { sb.serve(none, 8080, "none"); return sb.forward(none, 8080) }(),
		"egress none still answers connections the sandbox opens")

	some, _, gwSome, info := sb.isolatedSession(map[string]any{"egress": []string{"10.200.0.0/16:8001"}})
	require.Equal(t, []any{"10.200.0.0/16:8001"}, info["egress"])
	require.Equal(t, "one", sb.fetch(some, gwSome+":8001"), "the allow-listed port")
	require.Empty(t, sb.fetch(some, gwSome+":8002"), "a port not on the allow-list")

	snap := sb.ok("snapshot", map[string]any{"sandbox_id": "eos-e2e"})
	found := 0
	for _, w := range snap["workspaces"].([]any) {
		w := w.(map[string]any)
		switch w["workspace_id"] {
		case none:
			require.Equal(t, "none", w["egress"])
			found++
		case some:
			require.Equal(t, []any{"10.200.0.0/16:8001"}, w["egress"])
			found++
		case shared:
			require.Nil(t, w["egress"])
		}
	}
	require.Equal(t, 2, found, "%v", snap)

	e := sb.fail("create_workspace_session", map[string]any{"egress": "none"}, "invalid_request")
	require.Contains(t, e["message"], "network_profile isolated")
	sb.fail("create_workspace_session", map[string]any{"network_profile": "isolated", "egress": []string{"10.0.0.0/8"}}, "invalid_request")
	sb.fail("create_workspace_session", map[string]any{"network_profile": "isolated", "egress": "everything"}, "invalid_request")
}

// forward GETs who.txt from port of isolated session ws through the
// daemon's forward endpoint.
func (sb *sandbox) forward(ws string, port int) string {
	sb.t.Helper()
	var body string
	require.Eventually(sb.t, func() bool {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/forward/isolated=%s/%d/who.txt", sb.baseURL, ws, port), nil)
		req.Header.Set("Authorization", "Bearer "+sb.token)
		resp, err := sb.client.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 100*time.Millisecond, "forward to %s: %s", ws, body)
	return body
}

// A session's egress policy and its isolation from other sessions hold
// after the daemon restarts (Load rewrites the rules) and after the
// container restarts (the session starts again from its record).
func TestEgressSurvivesRestarts(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	none, _, gwNone, _ := sb.isolatedSession(map[string]any{"egress": "none"})
	other, ipOther, _, _ := sb.isolatedSession(map[string]any{})
	port := 8000
	check := func(when string) {
		t.Helper()
		port++ // servers started before a daemon restart still run
		shared := sb.session(nil)
		sb.serve(shared, port, "shared")
		sb.serve(other, port+100, "other")
		require.Eventually(t, func() bool { return sb.fetch(other, fmt.Sprintf("127.0.0.1:%d", port+100)) == "other" }, 10*time.Second, 200*time.Millisecond)
		require.Eventually(t, func() bool { return sb.fetch(shared, fmt.Sprintf("127.0.0.1:%d", port)) == "shared" }, 10*time.Second, 200*time.Millisecond)
		require.Empty(t, sb.fetch(none, fmt.Sprintf("%s:%d", gwNone, port)), "%s: egress none reached the sandbox", when)
		require.Empty(t, sb.fetch(none, fmt.Sprintf("%s:%d", ipOther, port+100)), "%s: egress none reached another session", when)
		info := sb.ok("list_workspace_sessions", map[string]any{})
		found := false
		for _, s := range info["workspace_sessions"].([]any) {
			if s := s.(map[string]any); s["workspace_session_id"] == none {
				require.Equal(t, "none", s["egress"], "%s", when)
				found = true
			}
		}
		require.True(t, found, "%s: %v", when, info)
		sb.ok("destroy_workspace_session", map[string]any{"workspace_session_id": shared, "force": true})
	}
	check("at start")

	sb.restartDaemon()
	check("after a daemon restart")

	docker(t, "restart", "-t", "5", sb.name)
	sb.connect()
	check("after a container restart")
}
