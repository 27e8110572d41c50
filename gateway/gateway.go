// Package gateway is the sandbox gateway: gin HTTP routes projected from the
// operation catalog and the seed's JSON-lines protocol on the same listener
// (a connection whose first byte is '{' speaks JSON lines), bearer-token
// auth, a 16 MiB body cap and request ids. Operations are dispatched to a
// Backend from the catalog's data (api.Operation: Lifecycle, Route,
// Progress): lifecycle ops to Temporal (a sandbox workflow update, a host
// read on the host's worker, or the sandbox records), runtime and
// observability ops to the sandbox's daemon through daemonclient. The
// gateway never calls Docker and never imports the activities.
package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
)

// Defaults.
const (
	DefaultAddr        = "127.0.0.1:7878"
	MaxBodyBytes       = jsonl.MaxLine
	LineReadTimeout    = 30 * time.Second
	MaxConcurrentConns = 256
	maxTokenBytes      = 4096
)

// Backend runs operations. Results are JSON-marshalable (json.RawMessage
// passes through); errors become the error envelope via api.AsError.
type Backend interface {
	// Lifecycle runs an op through Temporal. sandboxID is the scope's
	// sandbox, or the sandbox_id arg of a system-scope op ("" if none).
	Lifecycle(ctx context.Context, op, sandboxID string, args map[string]any) (any, error)
	// Runtime runs an op on the sandbox's daemon.
	Runtime(ctx context.Context, op, sandboxID string, args map[string]any) (any, error)
}

// Server is the gateway.
type Server struct {
	Backend Backend
	Token   string // required bearer token ("" refuses every request)
	Log     *slog.Logger
	// MaxBody caps an HTTP body or a JSON line (default MaxBodyBytes).
	MaxBody int
	// MaxHTTPConns caps concurrent HTTP connections (default
	// MaxConcurrentConns); read when Serve starts.
	MaxHTTPConns int
	// StreamPoll is how often a command stream polls read_command_lines
	// while there is no new output (default DefaultStreamPoll).
	StreamPoll time.Duration
	// StreamHeartbeat is the interval of SSE heartbeat comments (default
	// DefaultStreamHeartbeat).
	StreamHeartbeat time.Duration
	// SniffTimeout bounds a new connection's wait for its first byte and
	// for the HTTP server to take it (default SniffTimeout).
	SniffTimeout time.Duration
	// Metrics are served at /metrics. New sets fresh ones; a caller that
	// dialled Temporal with Metrics.TemporalInterceptor sets its own.
	Metrics *Metrics

	tokenSum [32]byte
	console  *consoleAuth
	engine   *gin.Engine
	sem      chan struct{}
	lineHook func(*jsonl.Request) // tests: runs before a JSON-lines dispatch
	httpHook func(http.ConnState) // tests: told each HTTP connection's state change
}

// New builds a server.
func New(b Backend, token string, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{Backend: b, Token: token, Log: log, MaxBody: MaxBodyBytes, sem: make(chan struct{}, MaxConcurrentConns)}
	s.SetMetrics(NewMetrics())
	s.tokenSum = sha256.Sum256([]byte(token))
	s.console = newConsoleAuth()
	s.engine = s.routes()
	return s
}

// SetMetrics makes m the server's metrics (and lets them count the fleet
// when the backend can list it).
func (s *Server) SetMetrics(m *Metrics) {
	if fl, ok := s.Backend.(FleetLister); ok {
		m.fleet.mu.Lock()
		m.fleet.lister = fl
		m.fleet.mu.Unlock()
	}
	if tb, ok := s.Backend.(*TemporalBackend); ok {
		tb.viewReads.Store(m.views)
	}
	s.Metrics = m
}

type ctxKey struct{}

// RequestID returns the request id carried by ctx.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

var requestIDRe = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

func requestIDOr(id string) string {
	if requestIDRe.MatchString(id) {
		return id
	}
	return client.NewRequestID()
}

// authorized compares in constant time (over digests, so the length of the
// presented token leaks nothing either).
func (s *Server) authorized(tok string) bool {
	if s.Token == "" || tok == "" || len(tok) > maxTokenBytes {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) == 1
}

func errUnauthorized() *api.Error {
	return api.Errorf(api.KindUnauthorized, nil, "missing or invalid gateway auth token")
}

func errTooLarge(max int) *api.Error {
	return api.Errorf(api.KindRequestTooLarge, map[string]any{"max_bytes": max}, "request exceeds %d bytes", max)
}

// Dispatch validates and runs one request; both transports end here.
func (s *Server) Dispatch(ctx context.Context, req *jsonl.Request) (json.RawMessage, *api.Error) {
	return s.DispatchProgress(ctx, req, nil)
}

// DispatchProgress is Dispatch with a progress sink: when progress is not
// nil, the catalog says the op reports progress and the Backend is a ProgressBackend, the
// backend's progress messages reach progress (serialized, never after
// DispatchProgress returns).
func (s *Server) DispatchProgress(ctx context.Context, req *jsonl.Request, progress func(msg string)) (json.RawMessage, *api.Error) {
	op, aerr := api.ResolvePublic(req.Op)
	if aerr != nil {
		return nil, aerr
	}
	if req.Scope.Kind == "" {
		req.Scope.Kind = op.ScopeOf(req.Scope.SandboxID)
	}
	if aerr := op.CheckScope(req.Scope.Kind, req.Scope.SandboxID); aerr != nil {
		s.Metrics.observe(op.Name, 0, nil, aerr)
		return nil, aerr
	}
	if aerr := op.Validate(req.Args); aerr != nil {
		s.Metrics.observe(op.Name, 0, nil, aerr)
		return nil, aerr
	}
	if aerr := checkUpload(op, req.Args); aerr != nil {
		s.Metrics.observe(op.Name, 0, nil, aerr)
		return nil, aerr
	}
	sandboxID := req.Scope.SandboxID
	if req.Scope.Kind == api.ScopeSystem {
		sandboxID, _ = req.Args["sandbox_id"].(string)
	}
	ctx = context.WithValue(ctx, ctxKey{}, req.RequestID)
	start := time.Now()
	var out any
	var err error
	pb, canProgress := s.Backend.(ProgressBackend)
	rpb, canRuntimeProgress := s.Backend.(RuntimeProgressBackend)
	streams := progress != nil && op.Progress
	switch {
	case op.IsLifecycle(req.Args) && canProgress && streams:
		lp := &lockedProgress{fn: progress}
		out, err = pb.LifecycleProgress(ctx, op.Name, sandboxID, req.Args, lp.call)
		lp.finish()
	case !op.IsLifecycle(req.Args) && canRuntimeProgress && streams:
		lp := &lockedProgress{fn: progress}
		out, err = rpb.RuntimeProgress(ctx, op.Name, sandboxID, req.Args, lp.call)
		lp.finish()
	case op.IsLifecycle(req.Args):
		out, err = s.Backend.Lifecycle(ctx, op.Name, sandboxID, req.Args)
	default:
		out, err = s.Backend.Runtime(ctx, op.Name, sandboxID, req.Args)
	}
	elapsed := time.Since(start)
	s.Log.Info("op", "request_id", req.RequestID, "op", op.Name, "sandbox_id", sandboxID, "ms", elapsed.Milliseconds(), "err", err)
	if err != nil {
		aerr := api.AsError(err)
		s.Metrics.observe(op.Name, elapsed, nil, aerr)
		return nil, aerr
	}
	raw, ok := out.(json.RawMessage)
	if !ok {
		b, merr := json.Marshal(out)
		if merr != nil {
			return nil, api.Errorf(api.KindInternal, nil, "encode result: %v", merr)
		}
		raw = b
	}
	if len(raw) == 0 || raw[0] != '{' {
		// Results are objects on the wire.
		b, _ := json.Marshal(map[string]json.RawMessage{"result": raw})
		raw = b
	}
	s.Metrics.observe(op.Name, elapsed, raw, nil)
	return raw, nil
}

// --- HTTP ---

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.engine }

func (s *Server) routes() *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.Use(gin.CustomRecovery(func(c *gin.Context, v any) {
		abort(c, api.Errorf(api.KindInternal, nil, "panic: %v", v))
	}))
	e.Use(func(c *gin.Context) {
		id := requestIDOr(c.GetHeader("X-Request-Id"))
		c.Set("request_id", id)
		c.Header("X-Request-Id", id)
		c.Next()
	})
	e.GET("/healthz", s.serveHealth)
	e.GET("/metrics", s.auth, func(c *gin.Context) { s.Metrics.Handler().ServeHTTP(c.Writer, c.Request) })
	e.GET("/v1/openapi.json", func(c *gin.Context) { c.Data(http.StatusOK, "application/json", api.OpenAPI()) })
	authed := e.Group("/v1", s.auth)
	authed.GET("/ops", func(c *gin.Context) {
		c.JSON(http.StatusOK, gin.H{"operations": api.PublicOps("")})
	})
	authed.POST("/ops/:op", s.httpOp)
	authed.GET("/sandboxes/:id/commands/:command_id/stream", s.streamCommand)
	authed.GET("/sandboxes/:id/events/stream", s.streamEvents)
	s.rawFileRoutes(authed)
	// MCP over streamable HTTP, one endpoint per tool set.
	e.Any("/mcp/:set", s.auth, s.serveMCP(s.mcpHandlers()))
	s.consoleRoutes(e) // the operator console (console.go)
	e.NoRoute(func(c *gin.Context) {
		abort(c, api.Errorf(api.KindNotFound, nil, "no route %s %s", c.Request.Method, c.Request.URL.Path))
	})
	e.NoMethod(func(c *gin.Context) {
		abort(c, api.Errorf(api.KindMethodNotAllowed, nil, "method %s not allowed on %s", c.Request.Method, c.Request.URL.Path))
	})
	return e
}

func abort(c *gin.Context, e *api.Error) {
	c.AbortWithStatusJSON(api.HTTPStatus(e.Kind), api.Envelope{Error: e})
}

func (s *Server) auth(c *gin.Context) {
	h := c.GetHeader("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if h == "" {
		// A console browser: its cookie and the CSRF token bound to it.
		if ok, refused := s.cookieAuthorized(c); ok || refused {
			if ok {
				c.Next()
			}
			return
		}
	}
	if !ok || !s.authorized(strings.TrimSpace(tok)) {
		c.Header("WWW-Authenticate", `Bearer realm="sandbox-gateway"`)
		abort(c, errUnauthorized())
		return
	}
	c.Next()
}

func (s *Server) httpOp(c *gin.Context) {
	began := time.Now()
	ctx, calls := daemonclient.WithTimings(c.Request.Context())
	// Every answer says how long it took here, and how much of it the
	// daemon calls made from here (a durable operation's are the
	// worker's: not in it).
	timed := func() {
		c.Header(api.ServerTimingHeader, append(api.ServerTiming{{Name: api.TimingGateway, Dur: time.Since(began)}}, calls.ServerTiming()...).String())
	}
	refuse := func(e *api.Error) {
		timed()
		abort(c, e)
	}
	if c.Request.ContentLength > int64(s.MaxBody) {
		refuse(errTooLarge(s.MaxBody))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, int64(s.MaxBody)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			refuse(errTooLarge(s.MaxBody))
			return
		}
		refuse(api.Errorf(api.KindBadJSON, nil, "read body: %v", err))
		return
	}
	req := &jsonl.Request{Scope: jsonl.SystemScope(), Args: map[string]any{}}
	if len(bytes.TrimSpace(body)) > 0 {
		var aerr *api.Error
		if req, aerr = jsonl.DecodeRequest(body); aerr != nil {
			refuse(aerr)
			return
		}
	}
	req.Op = c.Param("op")
	req.Token = ""
	if req.RequestID == "" {
		req.RequestID = c.GetString("request_id")
	} else {
		req.RequestID = requestIDOr(req.RequestID)
		c.Header("X-Request-Id", req.RequestID)
	}
	if wantsSSE(c) {
		s.dispatchSSE(c, req)
		return
	}
	out, aerr := s.Dispatch(ctx, req)
	if aerr != nil {
		refuse(aerr)
		return
	}
	timed()
	c.Data(http.StatusOK, "application/json", out)
}
