package hostlink

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
)

// sandboxID is the shape of a sandbox id (as the activities check it).
var sandboxID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// daemonPath is what may follow the sandbox id: the daemon's own routes.
var daemonPath = regexp.MustCompile(`^/(rpc/[a-z][a-z0-9_]{0,63}|health|files/[a-z_]{1,32}|forward/[A-Za-z0-9_./-]{0,512})$`)

// Lookup finds where the daemon of a sandbox of this host and deployment
// listens on this host; a sandbox that is not such gets a *api.Error.
type Lookup func(ctx context.Context, sandboxID string) (api.Endpoint, error)

// State is the copy of a sandbox's state its workflow left in this
// host's worker, encoded (workflows.MirroredCopyJSON), when it is of run
// runID and has seen every event of a history historyLen long; false
// otherwise.
type State func(sandboxID, runID string, historyLen int64) ([]byte, bool)

// Server forwards authenticated requests to the local daemons, and serves
// the state copies of the sandbox workflows its worker runs (State, at
// daemonclient.StatePrefix<sandbox id>) to the gateway's views.
type Server struct {
	Secret []byte // the deployment secret the daemon tokens derive from
	Host   string // this host's name, for errors
	Lookup Lookup
	State  State // nil: no copies served
	Log    *slog.Logger

	once  sync.Once
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	ep  api.Endpoint
	exp time.Time
}

type target struct{ ep api.Endpoint }

type ctxKey struct{}

// cacheFor is how long a looked-up endpoint is reused (a refused dial
// drops it at once).
const cacheFor = 5 * time.Second

func (s *Server) init() {
	s.once.Do(func() {
		if s.Log == nil {
			s.Log = slog.New(slog.DiscardHandler)
		}
		s.cache = map[string]cached{}
		tr := &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}
		s.proxy = &httputil.ReverseProxy{
			Transport:     tr,
			FlushInterval: -1, // stream NDJSON and anything else as it comes
			Rewrite: func(pr *httputil.ProxyRequest) {
				t := pr.In.Context().Value(ctxKey{}).(target)
				pr.Out.URL.Scheme = "http"
				pr.Out.URL.Host = net.JoinHostPort(t.ep.Host, strconv.Itoa(t.ep.Port))
				pr.Out.Host = pr.Out.URL.Host
			},
			ErrorHandler: s.proxyError,
		}
	})
}

// ServeHTTP serves ViaPrefix<sandbox id><daemon path>, and
// StatePrefix<sandbox id>.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	if id, ok := strings.CutPrefix(r.URL.Path, daemonclient.StatePrefix); ok {
		s.serveState(w, r, id)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, daemonclient.ViaPrefix)
	if !ok {
		writeError(w, http.StatusNotFound, api.Errorf(api.KindNotFound, nil, "no such route"))
		return
	}
	id, p, _ := strings.Cut(rest, "/")
	p = "/" + p
	if !sandboxID.MatchString(id) || !daemonPath.MatchString(p) || strings.Contains(p, "..") {
		writeError(w, http.StatusBadRequest, api.Errorf(api.KindInvalidRequest, nil, "invalid forwarder path"))
		return
	}
	if !s.authorized(w, r, id) {
		return
	}
	ep, err := s.lookup(r.Context(), id)
	if err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) {
			ae = api.Errorf(api.KindInternal, map[string]any{"sandbox_id": id, "host": s.Host}, "host %s cannot look up sandbox %s: %v", s.Host, id, err)
		}
		writeError(w, api.HTTPStatus(ae.Kind), ae)
		return
	}
	r2 := r.WithContext(context.WithValue(r.Context(), ctxKey{}, target{ep: ep}))
	r2.URL = &url.URL{Path: p, RawQuery: r.URL.RawQuery}
	r2.RequestURI = ""
	s.proxy.ServeHTTP(w, r2)
}

// authorized checks the sandbox's token before anything else: nothing
// about the host is said to a caller that does not hold the deployment
// secret.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request, id string) bool {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	want := daemonclient.Token(s.Secret, id)
	if subtle.ConstantTimeCompare([]byte(tok), []byte(want)) != 1 {
		writeError(w, http.StatusUnauthorized, api.Errorf(api.KindUnauthorized, nil, "missing or invalid sandbox token"))
		return false
	}
	return true
}

// runIDPattern is the shape of a Temporal run id (a UUID, or any short
// token of its characters).
var runIDPattern = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// serveState answers GET StatePrefix<id>?run_id=&history_length= with the
// copy of the sandbox's state this host's worker holds for that run, when
// it has seen that much of the history (200, the state's JSON); 204 when
// it holds none that new.
func (s *Server) serveState(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	run, n := q.Get("run_id"), q.Get("history_length")
	length, err := strconv.ParseInt(n, 10, 64)
	if r.Method != http.MethodGet || !sandboxID.MatchString(id) || !runIDPattern.MatchString(run) || err != nil || length <= 0 {
		writeError(w, http.StatusBadRequest, api.Errorf(api.KindInvalidRequest, nil, "want GET %s<sandbox id>?run_id=<run>&history_length=<n>", daemonclient.StatePrefix))
		return
	}
	if !s.authorized(w, r, id) {
		return
	}
	var st []byte
	ok := false
	if s.State != nil {
		st, ok = s.State(id, run, length)
	}
	if !ok {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(st)
}

func (s *Server) lookup(ctx context.Context, id string) (api.Endpoint, error) {
	s.mu.Lock()
	c, ok := s.cache[id]
	s.mu.Unlock()
	if ok && time.Now().Before(c.exp) {
		return c.ep, nil
	}
	ep, err := s.Lookup(ctx, id)
	if err != nil {
		return ep, err
	}
	if ep.Port <= 0 || ep.Port > 65535 {
		return ep, api.Errorf(api.KindOperationFailed, map[string]any{"sandbox_id": id, "host": s.Host, "availability": "unavailable"},
			"the daemon of sandbox %s is not published on host %s (is its container running?)", id, s.Host)
	}
	if ep.Host == "" {
		ep.Host = "127.0.0.1"
	}
	s.mu.Lock()
	s.cache[id] = cached{ep: ep, exp: time.Now().Add(cacheFor)}
	s.mu.Unlock()
	return ep, nil
}

// proxyError answers a request the daemon did not answer. A refused dial
// is marked so the client treats it as one (and looks the endpoint up
// again); anything else broke after the daemon may have seen it.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(ctxKey{}).(target)
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		s.mu.Lock()
		for id, c := range s.cache {
			if c.ep == t.ep {
				delete(s.cache, id)
			}
		}
		s.mu.Unlock()
		w.Header().Set(daemonclient.HeaderForward, daemonclient.ForwardRefused)
		writeError(w, http.StatusBadGateway, api.Errorf(api.KindInternal, map[string]any{"host": s.Host, "availability": "unavailable"}, "the daemon refused the connection"))
		return
	}
	if r.Context().Err() != nil {
		return // the caller went away
	}
	s.Log.Warn("hostlink forward", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusBadGateway, api.Errorf(api.KindInternal, map[string]any{"host": s.Host}, "the daemon's answer broke off"))
}

func writeError(w http.ResponseWriter, status int, e *api.Error) {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	if w.Header().Get(daemonclient.HeaderForward) == "" {
		// The forwarder's own answer, not the daemon's.
		w.Header().Set(daemonclient.HeaderForward, daemonclient.ForwardFailed)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.Envelope{Error: e})
}

// Listen serves s over TLS with cert on addr until ctx ends. It returns
// the bound listener's address once listening, and errors of Serve on
// the channel.
func Listen(ctx context.Context, addr string, cert Cert, s *Server) (net.Addr, <-chan error, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{
		Handler:           s,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert.TLS}},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(l, "", "") }()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return l.Addr(), errc, nil
}
