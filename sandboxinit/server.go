package sandboxinit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/hostcheck"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// handler serves one RPC operation: decode args from body, return a result.
type handler func(ctx context.Context, rid string, body []byte) (any, error)

// Server is the daemon's HTTP/JSON RPC endpoint. Every route needs the
// sandbox token (constant-time compare); bodies are capped, the number of
// requests served at once is capped (server_busy beyond it), and each
// request's id (X-Request-Id, or a new one) is its trace id.
type Server struct {
	d        *Daemon
	ops      map[string]handler
	quiet    map[string]bool // observability views: they record nothing
	slots    chan struct{}
	closing  atomic.Bool
	http     *http.Server
	red      *redactor
	importMu sync.Mutex // one base import at a time (a retried stream waits for the first)
}

// NewServer builds the RPC server of d.
func NewServer(d *Daemon) *Server {
	s := &Server{d: d, slots: make(chan struct{}, d.cfg.MaxConcurrent), red: newRedactor(d.cfg.StateDir)}
	s.ops, s.quiet = d.operations(), map[string]bool{}
	for name, h := range d.observabilityOps() {
		s.ops[name], s.quiet[name] = h, true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/rpc/", s.serveRPC)
	mux.HandleFunc("/health", s.serveHealth)
	mux.HandleFunc("/files/list", s.serveFilesList)
	mux.HandleFunc("/forward/", s.serveForward)
	mux.HandleFunc(api.ImportBasePath, s.serveImportBase)
	// CPU and heap profiles and the execution trace of the daemon for
	// `make bench`, behind the sandbox token like every route.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.Errorf(api.KindNotFound, nil, "not found"))
	})
	// The daemon is reached at 127.0.0.1:<the port Docker published>: any
	// loopback Host is ours, a name such as evil.example (DNS rebinding) is
	// refused, and no CORS grant leaves (not even one a forwarded app sets).
	s.http = &http.Server{Handler: hostcheck.Loopback().Handler(s.guard(mux)), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	return s
}

// Serve serves on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	err := s.http.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops admitting requests (server_shutting_down) and waits for
// those in flight, up to ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	return s.http.Shutdown(ctx)
}

// guard applies auth, shutdown, admission and the size cap to every route.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rid := r.Header.Get("X-Request-Id")
		if rid == "" || len(rid) > 256 { // workflow steps append their own parts to the caller's id
			rid = newRequestID()
		}
		rid = callerRequestID(rid)
		r.Header.Set("X-Request-Id", rid)
		w.Header().Set("X-Request-Id", rid)
		if s.closing.Load() {
			writeError(w, api.Errorf(api.KindShuttingDown, nil, "the daemon is shutting down"))
			return
		}
		if !s.authorized(r) {
			// Two answers need no token (the seed's): a health probe that
			// reveals nothing but liveness, and the refusal of a malformed
			// forward route, which depends on the URL alone.
			if r.URL.Path == "/health" {
				writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "service": "daemon_http"})
				return
			}
			if strings.HasPrefix(r.URL.Path, "/forward/") {
				if _, _, err := forwardRoute(r.URL.Path); err != nil {
					writeJSON(w, http.StatusBadRequest, api.Envelope{Error: err})
					return
				}
			}
			writeError(w, api.Errorf(api.KindUnauthorized, nil, "missing or wrong sandbox token"))
			return
		}
		select {
		case s.slots <- struct{}{}:
			defer func() { <-s.slots }()
		default:
			writeError(w, api.Errorf(api.KindServerBusy, map[string]any{"max_concurrent_requests": cap(s.slots)}, "the daemon is at its concurrency limit"))
			return
		}
		if r.URL.Path != api.ImportBasePath { // a workspace tar: the importer's limits apply
			r.Body = http.MaxBytesReader(w, r.Body, s.d.cfg.MaxRequestBytes)
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) authorized(r *http.Request) bool {
	tok := r.Header.Get("X-Sandbox-Token")
	if h := r.Header.Get("Authorization"); tok == "" && strings.HasPrefix(h, "Bearer ") {
		tok = h[len("Bearer "):]
	}
	if tok == "" || len(tok) > 1024 {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], s.d.tokenSum[:]) == 1
}

// callerRequestID is the request id a caller gave for a call the workflow
// layer makes on its behalf ("<workflow id>/update/<request id>"): an
// operation's owner in blame is operation:<request_id> and the events it
// records carry that id as their trace, as in the seed. Ids of the
// workflow's own steps ("<workflow id>/<step>") are kept whole.
func callerRequestID(rid string) string {
	if _, caller, ok := strings.Cut(rid, "/update/"); ok && caller != "" {
		return caller
	}
	return rid
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) serveRPC(w http.ResponseWriter, r *http.Request) {
	began := time.Now()
	if r.Method != http.MethodPost {
		writeError(w, api.Errorf(api.KindMethodNotAllowed, nil, "use POST"))
		return
	}
	op := strings.TrimPrefix(r.URL.Path, "/rpc/")
	h, ok := s.ops[op]
	if !ok {
		writeError(w, api.Errorf(api.KindUnknownOp, map[string]any{"op": op}, "unknown operation %q", op))
		return
	}
	body, err := readBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	defer s.d.inflight.begin(op)()
	rid := r.Header.Get("X-Request-Id")
	// Every path, streamed or not, runs through dispatch: the request's
	// trace, and quiet for the observability views.
	traced := func(ctx context.Context, rid string, body []byte) (any, error) {
		return s.dispatch(telemetry.WithTrace(ctx, rid), op, rid, h, body)
	}
	if wantsStream(op, r) {
		s.serveStreaming(w, r, traced, rid, body)
		return
	}
	res, err := traced(r.Context(), rid, body)
	setServerTiming(w, began)
	if err != nil {
		s.d.log.Debug("operation failed", "op", op, "request_id", rid, "err", err)
		writeError(w, err)
		return
	}
	if st, ok := res.(streamer); ok {
		st.stream(w)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// dispatch runs one operation. Observability views run quiet (they record
// nothing and are not activity); every other operation wakes the sampler
// and is a daemon.dispatch span in the request's trace.
func (s *Server) dispatch(ctx context.Context, op, rid string, h handler, body []byte) (any, error) {
	if s.quiet[op] {
		res, err := h(telemetry.Quiet(ctx), rid, body)
		return res, s.red.redact(err)
	}
	s.d.touch()
	ctx, sp := s.d.span(ctx, "daemon.dispatch", map[string]any{"op": op})
	var res any
	var err error
	if laned(op, body) {
		// Heavy background work: FIFO through the bounded lane, at a lower
		// CPU weight; interactive operations never wait on it.
		var waited time.Duration
		res, waited, err = s.d.lane.run(ctx, func(ctx context.Context) (any, error) { return h(ctx, rid, body) })
		sp.Set("lane", "background")
		sp.Set("lane_wait_ms", float64(waited.Microseconds())/1000)
	} else {
		res, err = h(ctx, rid, body)
	}
	if err != nil {
		sp.Set("error_kind", api.AsError(err).Kind)
	}
	sp.End(err)
	// The daemon's log and trace keep the whole error; the client gets
	// workspace paths only.
	return res, s.red.redact(err)
}

// streamer results write their own body (export streams).
type streamer interface{ stream(w http.ResponseWriter) }

func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, api.Errorf(api.KindRequestTooLarge, map[string]any{"limit_bytes": mbe.Limit}, "request body exceeds %d bytes", mbe.Limit)
		}
		return nil, api.Errorf(api.KindInvalidRequest, nil, "read request: %v", err)
	}
	return b, nil
}

// decode parses args strictly: unknown fields are refused, so a typo in an
// argument name is an error rather than a silently ignored default.
func decode[T any](body []byte) (T, error) {
	var v T
	if len(strings.TrimSpace(string(body))) == 0 {
		return v, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) {
			return v, api.Errorf(api.KindBadJSON, nil, "request body is not valid JSON: %v", err)
		}
		return v, api.Errorf(api.KindInvalidRequest, nil, "bad arguments: %v", err)
	}
	return v, nil
}

// op adapts a typed function to a handler.
func op[T any](f func(ctx context.Context, rid string, a T) (any, error)) handler {
	return func(ctx context.Context, rid string, body []byte) (any, error) {
		a, err := decode[T](body)
		if err != nil {
			return nil, err
		}
		return f(ctx, rid, a)
	}
}

// setServerTiming says in the answer's Server-Timing header how long the
// daemon took from reading the request to its answer (a streamed answer:
// to its start), so a caller can tell the daemon's time from the way to it
// and back (the gateway passes it on; bench scenario e reports it).
func setServerTiming(w http.ResponseWriter, began time.Time) {
	w.Header().Set(api.ServerTimingHeader, api.ServerTiming{{Name: api.TimingDaemon, Dur: time.Since(began)}}.String())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	e := api.AsError(err)
	writeJSON(w, api.HTTPStatus(e.Kind), api.Envelope{Error: e})
}

func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	m, err := s.d.store.Manifest()
	res := map[string]any{"status": "ok", "service": "daemon_http", "uptime_seconds": int(time.Since(s.d.started).Seconds()),
		"sessions": len(s.d.listSessions()), "in_flight": s.d.inflight.total(), "in_flight_ops": s.d.inflight.byOp(), "daemon_pid": os.Getpid(),
		"observability_dropped": s.d.obs.Store.Dropped()}
	if err == nil {
		res["manifest_version"], res["layer_count"] = m.Version, len(m.Layers)
	} else {
		res["base"] = "not imported"
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) serveFilesList(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, api.Errorf(api.KindMethodNotAllowed, nil, "use POST"))
		return
	}
	body, err := readBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	a, err := decode[api.FileListArgs](body)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := s.d.fileList(a)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) String() string { return fmt.Sprintf("daemon rpc (%d ops)", len(s.ops)) }

// inFlight counts the requests being served, by operation: /health shows
// both, so an operator (or a test) sees what a busy daemon is doing.
type inFlight struct {
	mu  sync.Mutex
	ops map[string]int
	n   int
}

// begin counts one request of op until the returned func is called.
func (f *inFlight) begin(op string) func() {
	f.mu.Lock()
	if f.ops == nil {
		f.ops = map[string]int{}
	}
	f.ops[op]++
	f.n++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.ops[op]--; f.ops[op] == 0 {
			delete(f.ops, op)
		}
		f.n--
		f.mu.Unlock()
	}
}

func (f *inFlight) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func (f *inFlight) byOp() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.ops))
	for op, n := range f.ops {
		out[op] = n
	}
	return out
}
