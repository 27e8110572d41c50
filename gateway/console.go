package gateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	dto "github.com/prometheus/client_model/go"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/console"
)

// The operator console (console/, served at /): a browser signs in with a
// one-time code the CLI (`sandbox-manager-cli console`) asks for with the
// bearer token, and gets an HttpOnly SameSite=Strict cookie. Requests
// authenticated by that cookie must also carry the CSRF token bound to it
// (header X-EOS-CSRF; a GET stream that cannot set headers may pass it as
// ?csrf=). The Host check of Serve applies to every path; console pages get
// a strict Content-Security-Policy. The bearer path is unchanged.
const (
	ConsoleCookie     = "eos_console"
	ConsoleCSRFHeader = "X-EOS-CSRF"
	// ConsoleCodeTTL is how long a one-time code can be exchanged.
	ConsoleCodeTTL = 2 * time.Minute
	// ConsoleSessionTTL is how long a signed-in browser stays signed in.
	ConsoleSessionTTL  = 12 * time.Hour
	maxConsoleCodes    = 64
	maxConsoleSessions = 256
	// consoleWatchEvery is how often a console watch re-reads its view.
	consoleWatchEvery = 2 * time.Second
)

// ConsoleCSP is the Content-Security-Policy of the console's pages: only
// our own scripts, styles and connections; no inline code, no framing.
const ConsoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// consoleAuth holds the outstanding one-time codes and the signed-in
// browsers, in memory only (a restarted gateway signs everyone out).
type consoleAuth struct {
	mu       sync.Mutex
	codes    map[[32]byte]time.Time // sha256(code) -> expiry
	sessions map[[32]byte]time.Time // sha256(cookie) -> expiry
	csrfKey  []byte
	now      func() time.Time
}

func newConsoleAuth() *consoleAuth {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return &consoleAuth{codes: map[[32]byte]time.Time{}, sessions: map[[32]byte]time.Time{}, csrfKey: k, now: time.Now}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func prune(m map[[32]byte]time.Time, now time.Time) {
	for k, exp := range m {
		if !now.Before(exp) {
			delete(m, k)
		}
	}
}

// newCode mints a one-time code.
func (a *consoleAuth) newCode() (string, *api.Error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	prune(a.codes, now)
	if len(a.codes) >= maxConsoleCodes {
		return "", api.Errorf(api.KindResourceExhausted, map[string]any{"max_codes": maxConsoleCodes},
			"too many console sign-in codes outstanding; wait %s for them to expire", ConsoleCodeTTL)
	}
	code := randomToken()
	a.codes[sha256.Sum256([]byte(code))] = now.Add(ConsoleCodeTTL)
	return code, nil
}

// exchange spends a code and opens a browser session; a code works once.
func (a *consoleAuth) exchange(code string) (string, *api.Error) {
	if code == "" || len(code) > 128 {
		return "", api.Errorf(api.KindUnauthorized, nil, "wrong or expired console sign-in code")
	}
	sum := sha256.Sum256([]byte(code))
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	exp, ok := a.codes[sum]
	if !ok || !now.Before(exp) {
		return "", api.Errorf(api.KindUnauthorized, nil, "wrong or expired console sign-in code (each code works once; run sandbox-manager-cli console for a new one)")
	}
	delete(a.codes, sum)
	prune(a.sessions, now)
	if len(a.sessions) >= maxConsoleSessions {
		return "", api.Errorf(api.KindResourceExhausted, map[string]any{"max_sessions": maxConsoleSessions}, "too many console sessions")
	}
	tok := randomToken()
	a.sessions[sha256.Sum256([]byte(tok))] = now.Add(ConsoleSessionTTL)
	return tok, nil
}

func (a *consoleAuth) valid(tok string) bool {
	if tok == "" || len(tok) > 128 {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.sessions[sum]
	return ok && a.now().Before(exp)
}

func (a *consoleAuth) revoke(tok string) {
	a.mu.Lock()
	delete(a.sessions, sha256.Sum256([]byte(tok)))
	a.mu.Unlock()
}

// csrf is the CSRF token bound to a session cookie.
func (a *consoleAuth) csrf(tok string) string {
	m := hmac.New(sha256.New, a.csrfKey)
	m.Write([]byte(tok))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (a *consoleAuth) csrfOK(tok, presented string) bool {
	want := a.csrf(tok)
	return presented != "" && subtle.ConstantTimeCompare([]byte(want), []byte(presented)) == 1
}

// cookieAuthorized reports whether c carries a live console cookie and the
// CSRF token bound to it (header, or ?csrf= on a GET). Without a cookie it
// says nothing; with a cookie but no valid CSRF token it refuses (abort).
func (s *Server) cookieAuthorized(c *gin.Context) (ok, refused bool) {
	ck, err := c.Request.Cookie(ConsoleCookie)
	if err != nil || ck.Value == "" {
		return false, false
	}
	if !s.console.valid(ck.Value) {
		return false, false
	}
	presented := c.GetHeader(ConsoleCSRFHeader)
	if presented == "" && c.Request.Method == http.MethodGet {
		presented = c.Query("csrf")
	}
	if !s.console.csrfOK(ck.Value, presented) {
		abort(c, api.Errorf(api.KindUnauthorized, map[string]any{"header": ConsoleCSRFHeader},
			"a console request needs the %s header bound to its session", ConsoleCSRFHeader))
		return false, true
	}
	return true, false
}

// consoleRoutes adds the console's pages and endpoints to e.
func (s *Server) consoleRoutes(e *gin.Engine) {
	e.GET("/", s.consolePage)
	e.GET("/index.html", s.consolePage)
	e.GET("/assets/*file", s.consoleAsset)
	g := e.Group("/console")
	g.POST("/code", s.bearerOnly, s.consoleCode)
	g.POST("/session", s.consoleSignIn)
	g.GET("/session", s.consoleWhoAmI)
	g.DELETE("/session", s.auth, s.consoleSignOut)
	g.GET("/watch", s.auth, s.consoleWatch)
	g.GET("/terminal", s.auth, s.consoleTerminal)
}

// bearerOnly admits the bearer token only: a signed-in browser cannot mint
// more sign-in codes.
func (s *Server) bearerOnly(c *gin.Context) {
	tok, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	if !ok || !s.authorized(strings.TrimSpace(tok)) {
		c.Header("WWW-Authenticate", `Bearer realm="sandbox-gateway"`)
		abort(c, errUnauthorized())
		return
	}
	c.Next()
}

func consoleHeaders(c *gin.Context) {
	h := c.Writer.Header()
	h.Set("Content-Security-Policy", ConsoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

func (s *Server) consolePage(c *gin.Context) {
	b, err := fs.ReadFile(console.Dist, "index.html")
	if err != nil {
		abort(c, api.Errorf(api.KindNotFound, nil, "the console bundle is not built (make console)"))
		return
	}
	consoleHeaders(c)
	c.Header("Cache-Control", "no-store")
	c.Data(http.StatusOK, "text/html; charset=utf-8", b)
}

func (s *Server) consoleAsset(c *gin.Context) {
	name := path.Clean("assets/" + strings.TrimPrefix(c.Param("file"), "/"))
	if !strings.HasPrefix(name, "assets/") || strings.Contains(name, "..") {
		abort(c, api.Errorf(api.KindNotFound, nil, "no asset %s", c.Param("file")))
		return
	}
	b, err := fs.ReadFile(console.Dist, name)
	if err != nil {
		abort(c, api.Errorf(api.KindNotFound, nil, "no asset %s", c.Param("file")))
		return
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	consoleHeaders(c)
	c.Header("Cache-Control", "no-cache")
	c.Data(http.StatusOK, ct, b)
}

// consoleCode serves POST /console/code (bearer token): a one-time code and
// the URL that signs a browser in with it.
func (s *Server) consoleCode(c *gin.Context) {
	code, aerr := s.console.newCode()
	if aerr != nil {
		abort(c, aerr)
		return
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, gin.H{"code": code, "url": "http://" + c.Request.Host + "/#login=" + code,
		"expires_in_s": int(ConsoleCodeTTL.Seconds())})
}

// sameOrigin refuses a browser request whose Origin is another site's.
func sameOrigin(c *gin.Context) *api.Error {
	o := c.GetHeader("Origin")
	if o == "" || o == "http://"+c.Request.Host {
		return nil
	}
	return api.Errorf(api.KindUnauthorized, map[string]any{"origin": o}, "cross-origin console request refused")
}

func (s *Server) setConsoleCookie(c *gin.Context, value string, maxAge int) {
	http.SetCookie(c.Writer, &http.Cookie{Name: ConsoleCookie, Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: maxAge})
}

// consoleSignIn serves POST /console/session {"code": "..."}: the code is
// spent, the cookie set, and the CSRF token returned.
func (s *Server) consoleSignIn(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	if aerr := sameOrigin(c); aerr != nil {
		abort(c, aerr)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, 4096))
	if err != nil {
		abort(c, errTooLarge(4096))
		return
	}
	var req struct {
		Code string `json:"code"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		abort(c, api.Errorf(api.KindBadJSON, nil, "body must be {\"code\": \"...\"}: %v", err))
		return
	}
	tok, aerr := s.console.exchange(req.Code)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	s.setConsoleCookie(c, tok, int(ConsoleSessionTTL.Seconds()))
	c.JSON(http.StatusOK, gin.H{"csrf": s.console.csrf(tok)})
}

// consoleWhoAmI serves GET /console/session: the CSRF token of a signed-in
// browser (a reloaded page needs it; SameSite=Strict and no CORS grant keep
// other sites from reading it).
func (s *Server) consoleWhoAmI(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	ck, err := c.Request.Cookie(ConsoleCookie)
	if err != nil || !s.console.valid(ck.Value) {
		abort(c, api.Errorf(api.KindUnauthorized, nil, "not signed in to the console: run sandbox-manager-cli console"))
		return
	}
	c.JSON(http.StatusOK, gin.H{"csrf": s.console.csrf(ck.Value)})
}

func (s *Server) consoleSignOut(c *gin.Context) {
	if ck, err := c.Request.Cookie(ConsoleCookie); err == nil {
		s.console.revoke(ck.Value)
	}
	s.setConsoleCookie(c, "", -1)
	c.JSON(http.StatusOK, gin.H{"signed_out": true})
}

// maxConsoleViews caps the views one console watch follows (a browser has
// six HTTP/1.1 connections per host, so a page watches all its views over
// one stream).
const maxConsoleViews = 8

type consoleView struct {
	Op        string         `json:"op"`
	SandboxID string         `json:"sandbox_id,omitempty"`
	Args      map[string]any `json:"args,omitempty"`
}

// consoleWatch serves GET /console/watch?v=VIEW[&v=VIEW]..., each VIEW a
// JSON object {op, sandbox_id?, args?} naming a read-only operation, as
// Server-Sent Events: `event: view` with data {"i": index, "result": ...}
// or {"i": index, "error": {...}} for each view at once, and again every 2 s
// when it changed. op "health" is the health report with the gateway's
// metrics.
func (s *Server) consoleWatch(c *gin.Context) {
	specs := c.QueryArray("v")
	if len(specs) == 0 || len(specs) > maxConsoleViews {
		abort(c, api.Errorf(api.KindInvalidRequest, map[string]any{"max_views": maxConsoleViews}, "watch 1..%d views (v=<json>)", maxConsoleViews))
		return
	}
	rid := c.GetString("request_id")
	reads := make([]func(ctx context.Context) (json.RawMessage, *api.Error), len(specs))
	for i, spec := range specs {
		if len(spec) > 4096 {
			abort(c, errTooLarge(4096))
			return
		}
		var v consoleView
		dec := json.NewDecoder(strings.NewReader(spec))
		dec.UseNumber()
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			abort(c, api.Errorf(api.KindBadJSON, map[string]any{"view": i}, "view %d must be {op, sandbox_id?, args?}: %v", i, err))
			return
		}
		if v.Op == "health" {
			reads[i] = s.consoleHealth
			continue
		}
		op, aerr := api.ResolvePublic(v.Op)
		if aerr != nil {
			abort(c, aerr)
			return
		}
		if !op.Hints().ReadOnly {
			abort(c, api.Errorf(api.KindInvalidRequest, map[string]any{"op": op.Name}, "only read-only operations can be watched; %s changes state", op.Name))
			return
		}
		args := v.Args
		if args == nil {
			args = map[string]any{}
		}
		scope := jsonl.SystemScope()
		if op.ScopeOf(v.SandboxID) == api.ScopeSandbox {
			scope = jsonl.SandboxScope(v.SandboxID)
		} else if v.SandboxID != "" {
			args["sandbox_id"] = v.SandboxID
		}
		if aerr := op.CheckScope(scope.Kind, scope.SandboxID); aerr != nil {
			abort(c, aerr)
			return
		}
		if aerr := op.Validate(args); aerr != nil {
			abort(c, aerr)
			return
		}
		first := true
		reads[i] = func(ctx context.Context) (json.RawMessage, *api.Error) {
			a := make(map[string]any, len(args))
			for k, v := range args {
				a[k] = v
			}
			if first {
				// The first read is logged and counted like any request;
				// the re-reads are not (the console's polling is not load).
				first = false
				return s.Dispatch(ctx, &jsonl.Request{Op: op.Name, RequestID: rid, Scope: scope, Args: a})
			}
			return s.reread(context.WithValue(ctx, ctxKey{}, rid), op, scope, a)
		}
	}
	ctx := c.Request.Context()
	ev := startSSE(c)
	defer ev.close()
	stop := make(chan struct{})
	defer close(stop)
	go s.heartbeats(ev, stop)
	last := make([][]byte, len(reads))
	round := func() {
		outs := make([][]byte, len(reads))
		var wg sync.WaitGroup
		for i, read := range reads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, aerr := read(ctx)
				if aerr != nil {
					outs[i] = mustJSON(map[string]any{"i": i, "error": aerr})
				} else {
					outs[i] = mustJSON(map[string]any{"i": i, "result": out})
				}
			}()
		}
		wg.Wait()
		for i, b := range outs {
			if !bytes.Equal(b, last[i]) {
				last[i] = b
				ev.event("view", b)
			}
		}
	}
	round()
	every := consoleWatchEvery
	if s.StreamPoll > 0 && s.StreamPoll < every {
		every = s.StreamPoll
	}
	everyTick(ctx, every, func() bool { round(); return true })
}

// everyTick calls fn every d until ctx ends or fn returns false.
func everyTick(ctx context.Context, d time.Duration, fn func() bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !fn() {
			return
		}
	}
}

// reread runs a validated read-only op again, straight to the backend.
func (s *Server) reread(ctx context.Context, op *api.Operation, scope jsonl.Scope, args map[string]any) (json.RawMessage, *api.Error) {
	sandboxID := scope.SandboxID
	if scope.Kind == api.ScopeSystem {
		sandboxID, _ = args["sandbox_id"].(string)
	}
	var out any
	var err error
	if op.IsLifecycle(args) {
		out, err = s.Backend.Lifecycle(ctx, op.Name, sandboxID, args)
	} else {
		out, err = s.Backend.Runtime(ctx, op.Name, sandboxID, args)
	}
	if err != nil {
		return nil, api.AsError(err)
	}
	if raw, ok := out.(json.RawMessage); ok {
		return raw, nil
	}
	raw, merr := json.Marshal(out)
	if merr != nil {
		return nil, api.Errorf(api.KindInternal, nil, "encode result: %v", merr)
	}
	return raw, nil
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// consoleHealth is the health report (as /healthz with the token) and the
// counters the Health page turns into rates.
func (s *Server) consoleHealth(ctx context.Context) (json.RawMessage, *api.Error) {
	rep := map[string]any{"status": "ok", "service": "sandbox-gateway"}
	if hc, ok := s.Backend.(HealthChecker); ok {
		hctx, cancel := context.WithTimeout(ctx, healthTimeout)
		r, critical := hc.Health(hctx)
		cancel()
		for k, v := range r {
			rep[k] = v
		}
		switch {
		case !critical:
			rep["status"] = "down"
		case degraded(r):
			rep["status"] = "degraded"
		}
	}
	rep["metrics"] = s.Metrics.summary()
	rep["now_unix_ms"] = time.Now().UnixMilli()
	return mustJSON(rep), nil
}

// summary is what the console's Health page shows of the metrics:
// operations and their total latency by op, publishes by outcome.
func (m *Metrics) summary() map[string]any {
	type opStat struct {
		Count   float64 `json:"count"`
		Errors  float64 `json:"errors"`
		SumSecs float64 `json:"sum_seconds"`
	}
	ops := map[string]*opStat{}
	publishes := map[string]float64{}
	var total float64
	mfs, err := m.Registry.Gather()
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	label := func(ls []*dto.LabelPair, name string) string {
		for _, l := range ls {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "eos_operations_total":
			for _, mt := range mf.GetMetric() {
				op := label(mt.GetLabel(), "op")
				st := ops[op]
				if st == nil {
					st = &opStat{}
					ops[op] = st
				}
				v := mt.GetCounter().GetValue()
				st.Count += v
				total += v
				if label(mt.GetLabel(), "outcome") != "ok" {
					st.Errors += v
				}
			}
		case "eos_operation_duration_seconds":
			for _, mt := range mf.GetMetric() {
				op := label(mt.GetLabel(), "op")
				st := ops[op]
				if st == nil {
					st = &opStat{}
					ops[op] = st
				}
				st.SumSecs += mt.GetHistogram().GetSampleSum()
			}
		case "eos_publishes_total":
			for _, mt := range mf.GetMetric() {
				publishes[label(mt.GetLabel(), "outcome")] += mt.GetCounter().GetValue()
			}
		}
	}
	return map[string]any{"operations_total": total, "operations": ops, "publishes": publishes}
}
