package sandboxinit

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// serveForward proxies /forward/shared/<port>/<rest> to 127.0.0.1:<port>
// in the sandbox's network, and /forward/isolated=<session>/<port>/<rest>
// to an isolated session's address, connecting from inside its network
// namespace. HTTP and WebSocket (upgrade) both pass;
// the sandbox token is stripped before the request leaves the daemon.
func (s *Server) serveForward(w http.ResponseWriter, r *http.Request) {
	parts, port, err := forwardRoute(r.URL.Path)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, api.Envelope{Error: err})
		return
	}
	host := "127.0.0.1"
	dial := netDialer.DialContext
	switch {
	case parts[0] == "shared":
	case strings.HasPrefix(parts[0], "isolated="):
		id := strings.TrimPrefix(parts[0], "isolated=")
		sess, err := s.d.session(id)
		if err != nil {
			writeJSON(w, http.StatusNotFound, api.Envelope{Error: api.Errorf("unknown_workspace", map[string]any{"workspace_session_id": id}, "no workspace session %s", id)})
			return
		}
		if sess.rt == nil || sess.rt.IP() == "" {
			writeJSON(w, http.StatusForbidden, api.Envelope{Error: api.Errorf("no_reachable_ip", nil, "workspace session %s has no isolated address", id)})
			return
		}
		host = sess.rt.IP()
		// From inside the session's own network namespace: nothing in the
		// sandbox's (shared sessions) can open a connection to it.
		dial = sess.rt.DialContext
	default:
		writeJSON(w, http.StatusNotFound, api.Envelope{Error: api.Errorf(api.KindNotFound, nil, "unknown forward prefix %q", parts[0])})
		return
	}
	path := "/"
	if len(parts) == 3 {
		path += parts[2]
	}
	prefix := "/forward/" + parts[0] + "/" + parts[1]
	target := &url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", host, port)}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path, pr.Out.URL.RawPath = path, ""
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("X-Sandbox-Token")
			pr.SetXForwarded()
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
		},
		Transport: &http.Transport{ResponseHeaderTimeout: 30 * time.Second, DialContext: dial},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeJSON(w, http.StatusBadGateway, api.Envelope{Error: api.Errorf("connect_failed", map[string]any{"target": target.Host}, "forward to %s failed: %v", target.Host, err)})
		},
	}
	proxy.ServeHTTP(w, r)
}

var netDialer = net.Dialer{Timeout: 10 * time.Second}

// forwardRoute splits /forward/<scope>/<port>[/<rest>] and checks its
// shape. A malformed route is refused (400) before authentication, as the
// seed does: the answer depends on the URL alone and reveals nothing.
func forwardRoute(p string) ([]string, int, *api.Error) {
	parts := strings.SplitN(strings.TrimPrefix(p, "/forward/"), "/", 3)
	if len(parts) < 2 {
		return nil, 0, api.Errorf("invalid_route", nil, "use /forward/shared/<port>/... or /forward/isolated=<workspace_session_id>/<port>/...")
	}
	port, err := strconv.Atoi(parts[1])
	if err != nil || port < 1 || port > 65535 {
		return nil, 0, api.Errorf("invalid_port", nil, "port must be 1..65535, not %q", parts[1])
	}
	return parts, port, nil
}
