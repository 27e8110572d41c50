package hostcheck

import (
	"net"
	"net/http"
	"strings"
)

// Policy says which Host headers a server answers.
type Policy struct {
	exact    map[string]bool
	loopback bool // any loopback literal or localhost, any port
}

// For allows the addresses a TCP listener on addr (host:port, as
// net.Listener.Addr().String() gives it) serves.
func For(addrs ...string) *Policy {
	p := &Policy{exact: map[string]bool{}}
	for _, addr := range addrs {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		p.add(host, port)
		ip := net.ParseIP(host)
		if host == "" || host == "localhost" || (ip != nil && (ip.IsLoopback() || ip.IsUnspecified())) {
			for _, h := range []string{"127.0.0.1", "localhost", "::1"} {
				p.add(h, port)
			}
		}
	}
	return p
}

// Loopback allows any loopback IP literal or localhost, with any port.
func Loopback() *Policy { return &Policy{loopback: true} }

func (p *Policy) add(host, port string) {
	hp := strings.ToLower(net.JoinHostPort(host, port))
	p.exact[hp] = true
	if port == "80" {
		p.exact[strings.ToLower(bracket(host))] = true
	}
}

func bracket(h string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

// Allowed reports whether a request's Host header is one p serves.
func (p *Policy) Allowed(host string) bool {
	host = strings.ToLower(host)
	if p.exact[host] {
		return true
	}
	if !p.loopback {
		return false
	}
	h := host
	if sh, _, err := net.SplitHostPort(host); err == nil {
		h = sh
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Handler refuses requests p does not serve with 421 Misdirected Request
// and strips any CORS grant the wrapped handler sets.
func (p *Policy) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.Allowed(r.Host) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMisdirectedRequest)
			_, _ = w.Write([]byte(`{"error":{"kind":"invalid_request","message":"Host header names an address this server does not serve"}}` + "\n"))
			return
		}
		next.ServeHTTP(noCORS{w}, r)
	})
}

// noCORS drops Access-Control-* response headers before they are sent.
type noCORS struct{ http.ResponseWriter }

func (n noCORS) strip() {
	for k := range n.ResponseWriter.Header() {
		if strings.HasPrefix(k, "Access-Control-") {
			n.ResponseWriter.Header().Del(k)
		}
	}
}

func (n noCORS) WriteHeader(code int) { n.strip(); n.ResponseWriter.WriteHeader(code) }

func (n noCORS) Write(b []byte) (int, error) { n.strip(); return n.ResponseWriter.Write(b) }

// Unwrap lets http.ResponseController reach Flush, deadlines and hijacking.
func (n noCORS) Unwrap() http.ResponseWriter { return n.ResponseWriter }

// Flush flushes when the wrapped writer can (SSE, NDJSON streams).
func (n noCORS) Flush() {
	if f, ok := n.ResponseWriter.(http.Flusher); ok {
		n.strip()
		f.Flush()
	}
}
