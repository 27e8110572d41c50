package daemonclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

const (
	// MaxResponse caps a daemon's answer (and one frame of a streamed one);
	// the daemon caps its requests at the same 16 MiB.
	MaxResponse = 16 << 20
	// DefaultTimeout bounds a call that sets no Timeout of its own.
	DefaultTimeout = 5 * time.Minute
	maxRequestID   = 256
)

var opPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// Token derives a sandbox's daemon token from the deployment secret:
// hex(HMAC-SHA256(secret, "daemon-token/"+sandboxID)). Deriving it where it
// is needed keeps it out of workflow history, Docker labels, env and argv.
func Token(secret []byte, sandboxID string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("daemon-token/" + sandboxID))
	return hex.EncodeToString(m.Sum(nil))
}

// Resolver looks up where a sandbox's daemon listens now (after a container
// restart Docker may have published it elsewhere). It is asked only after a
// call could not connect.
type Resolver func(ctx context.Context, sandboxID string) (api.Endpoint, error)

// Client is the one client of the daemons' RPC. It is safe for concurrent
// use; one Client keeps one keep-alive pool for every daemon.
type Client struct {
	secret  []byte
	http    *http.Client
	resolve Resolver
	pins    *pins    // forwarders' certificate fingerprints by address (Via)
	direct  *directs // the direct paths in use and those that failed (nil: none)
}

// New builds a client whose tokens derive from secret. resolve may be nil.
func New(secret []byte, resolve Resolver, opts ...Option) *Client {
	o := options{dialTimeout: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	p := &pins{m: map[string]string{}}
	d := &directs{}
	dialer := &net.Dialer{Timeout: o.dialTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:         d.dialer(dialer.DialContext),
		DialTLSContext:      p.dialTLS(dialer),
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{secret: secret, http: &http.Client{Transport: tr}, resolve: resolve, pins: p, direct: d}
}

// Option sets up a Client (New).
type Option func(*options)

type options struct{ dialTimeout time.Duration }

// DialTimeout bounds each connection's dial (and a forwarder's TLS
// handshake) to d (default 5 s): a caller with a short budget learns an
// unreachable address as a refused dial, not as its own deadline.
func DialTimeout(d time.Duration) Option { return func(o *options) { o.dialTimeout = d } }

// WithHTTP returns a copy of c that sends through hc (tests, custom
// transports), without direct paths (hc's dialer does not bound them).
func (c *Client) WithHTTP(hc *http.Client) *Client {
	cp := *c
	cp.http, cp.direct = hc, nil
	return &cp
}

// Token is the daemon token of one sandbox.
func (c *Client) Token(sandboxID string) string { return Token(c.secret, sandboxID) }

// Call is one RPC: POST /rpc/<Op> with Args as the body.
type Call struct {
	SandboxID string
	Endpoint  api.Endpoint
	Op        string
	Args      json.RawMessage // nil or empty: {}
	// RequestID is sent as X-Request-Id: the daemon's trace id, and its
	// idempotency key for the steps of a publish.
	RequestID string
	Timeout   time.Duration // 0: DefaultTimeout
	// Progress, when set, asks the daemon to stream a command's output
	// lines (NDJSON) while the call runs.
	Progress func(api.OutputLine)
	// Via, when set, sends the call through the forwarder of the
	// sandbox's host (the daemon listens on that host's loopback only).
	Via *Via
	// Direct, when set (and Via is not), is the daemon's address on its
	// container's network: tried first, skipping Docker's proxy (direct.go).
	Direct *api.Endpoint
}

// ConnError is a call that did not get an answer from the daemon: it could
// not connect, or the connection broke. Retrying is safe only where the
// request is idempotent (Refused reports it never reached the daemon).
type ConnError struct {
	SandboxID string
	Op        string
	Refused   bool // the connection was never made: the daemon did not see the request
	Err       error
}

func (e *ConnError) Error() string {
	return fmt.Sprintf("daemon of sandbox %s unreachable (%s): %v", e.SandboxID, e.Op, e.Err)
}
func (e *ConnError) Unwrap() error { return e.Err }

// IsConn reports whether err is a ConnError.
func IsConn(err error) bool {
	var ce *ConnError
	return errors.As(err, &ce)
}

// Do runs a call and returns the daemon's JSON result. A daemon error
// envelope comes back as *api.Error, unchanged; no answer is *ConnError.
// When the daemon cannot be reached at the call's endpoint and the client
// has a Resolver, the endpoint is looked up again and the call is retried
// once there if it moved: a refused connection never reached the daemon, so
// the retry cannot run an operation twice.
func (c *Client) Do(ctx context.Context, call Call) (json.RawMessage, api.Endpoint, error) {
	if err := check(call); err != nil {
		return nil, call.Endpoint, err
	}
	body := []byte(call.Args)
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	} else if !json.Valid(body) {
		return nil, call.Endpoint, api.Errorf(api.KindInvalidRequest, nil, "args of %s are not valid JSON", call.Op)
	}
	timeout := call.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := c.do(ctx, call, body)
	// A refused connection never reached the daemon, and an idempotent
	// operation may run again: look the endpoint up again and retry, for a
	// few seconds — a restarting container is back within about one (while
	// it starts, Docker's proxy accepts connections and drops them).
	retry := func(err error) bool { return refused(err) || (IsConn(err) && idempotent(call.Op)) }
	deadline := time.Now().Add(RefusedWait)
	// The endpoint is looked up at most maxResolves times a call (each is a
	// Docker inspect, or a workflow update at the gateway): first at once,
	// then once the container had time to be published again.
	resolves := 0
	for delay := 50 * time.Millisecond; retry(err) && c.resolve != nil && ctx.Err() == nil && time.Now().Before(deadline); delay = min(2*delay, 500*time.Millisecond) {
		if resolves < maxResolves && (resolves == 0 || delay >= 400*time.Millisecond) {
			resolves++
			ep, rerr := c.resolve(ctx, call.SandboxID)
			var refusal *api.Error
			if errors.As(rerr, &refusal) {
				return nil, call.Endpoint, refusal // e.g. the container is stopped: say so, now
			}
			if rerr == nil && ep.Port > 0 {
				call.Endpoint = ep
			}
		}
		out, err = c.do(ctx, call, body)
		if !retry(err) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
	return out, call.Endpoint, err
}

// RefusedWait is how long a call keeps retrying a daemon that refuses
// connections (its container restarting) before it reports it unreachable.
var RefusedWait = 5 * time.Second

const maxResolves = 3

// idempotent reports whether the catalog says running op again changes
// nothing more (reads, views, writes of the same content).
func idempotent(op string) bool {
	o, ok := api.LookupOp(op)
	return ok && o.Hints().Idempotent
}

func refused(err error) bool {
	var ce *ConnError
	return err != nil && errors.As(err, &ce) && ce.Refused
}

func check(call Call) error {
	if call.SandboxID == "" {
		return api.Errorf(api.KindInvalidRequest, nil, "sandbox_id is required")
	}
	if !opPattern.MatchString(call.Op) {
		return api.Errorf(api.KindInvalidRequest, nil, "invalid daemon operation %q", call.Op)
	}
	if len(call.RequestID) > maxRequestID {
		return api.Errorf(api.KindInvalidRequest, nil, "request id longer than %d bytes", maxRequestID)
	}
	return nil
}

func (c *Client) do(ctx context.Context, call Call, body []byte) (json.RawMessage, error) {
	direct := c.directAddr(call)
	for {
		req, err := c.RequestVia(ctx, http.MethodPost, call.SandboxID, call.Endpoint, call.Via, "/rpc/"+call.Op, body, call.RequestID)
		if err != nil {
			return nil, err
		}
		if call.Progress != nil {
			req.Header.Set("Accept", api.ContentTypeNDJSON)
		}
		if direct != "" {
			goDirect(req, direct)
		}
		resp, err := c.roundTrip(req)
		if err != nil && direct != "" && dialFailed(err) && ctx.Err() == nil {
			c.direct.failed(direct) // nothing was sent: the published endpoint now
			direct = ""
			continue
		}
		if err == nil && direct != "" && resp.StatusCode == http.StatusUnauthorized {
			// Another daemon has the address now (a restarted container's
			// was given to another): it refused before doing anything.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			c.direct.failed(direct)
			direct = ""
			continue
		}
		if err != nil {
			return nil, connError(call, err)
		}
		return c.answer(resp, call)
	}
}

// answer reads the daemon's answer to call.
func (c *Client) answer(resp *http.Response, call Call) (json.RawMessage, error) {
	defer resp.Body.Close()
	if call.Progress != nil && resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), api.ContentTypeNDJSON) {
		return readStream(resp.Body, call, call.Progress)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err != nil {
		return nil, connError(call, err)
	}
	if len(raw) > MaxResponse {
		return nil, api.Errorf(api.KindInternal, map[string]any{"op": call.Op}, "the daemon's answer to %s exceeds %d bytes", call.Op, MaxResponse)
	}
	if resp.StatusCode == http.StatusOK {
		if !json.Valid(raw) {
			return nil, api.Errorf(api.KindInternal, map[string]any{"op": call.Op}, "the daemon's answer to %s is not JSON", call.Op)
		}
		return json.RawMessage(raw), nil
	}
	err = Failure(call.Op, resp.StatusCode, raw)
	if ae, ok := err.(*api.Error); ok && resp.Header.Get(HeaderForward) == ForwardFailed {
		return nil, &ForwarderError{Err: ae}
	}
	return nil, err
}

func connError(call Call, err error) error {
	var op *net.OpError
	refused := errors.As(err, &op) && op.Op == "dial"
	var fr *forwardRefused
	if errors.As(err, &fr) {
		refused = true
	}
	return &ConnError{SandboxID: call.SandboxID, Op: call.Op, Refused: refused, Err: err}
}

// ResponseError is a non-200 answer that is not the daemon's envelope (a
// proxy, a daemon that crashed mid-answer).
type ResponseError struct {
	Op     string
	Status int
	Body   string // the first bytes
}

func (e *ResponseError) Error() string {
	return fmt.Sprintf("the daemon answered %s with HTTP %d: %s", e.Op, e.Status, e.Body)
}

// Transient reports whether the same request may succeed later.
func (e *ResponseError) Transient() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests
}

// Failure maps a non-200 answer to an error: the daemon's envelope as the
// *api.Error it sent, anything else as *ResponseError.
func Failure(op string, status int, raw []byte) error {
	var env api.Envelope
	if json.Unmarshal(raw, &env) == nil && env.Error != nil && env.Error.Kind != "" {
		if env.Error.Details == nil {
			env.Error.Details = map[string]any{}
		}
		return env.Error
	}
	return &ResponseError{Op: op, Status: status, Body: truncate(string(raw), 300)}
}

// Request builds a request to a sandbox's daemon with its derived token;
// the token is only ever in this header.
func (c *Client) Request(ctx context.Context, method, sandboxID string, ep api.Endpoint, path string, body []byte, requestID string) (*http.Request, error) {
	return c.RequestVia(ctx, method, sandboxID, ep, nil, path, body, requestID)
}

// RequestVia is Request through a host's forwarder when via is set.
func (c *Client) RequestVia(ctx context.Context, method, sandboxID string, ep api.Endpoint, via *Via, path string, body []byte, requestID string) (*http.Request, error) {
	base, err := BaseURL(ep)
	if err != nil {
		return nil, err
	}
	if via != nil {
		if base, err = c.viaBase(via, sandboxID); err != nil {
			return nil, err
		}
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "daemon request: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token(sandboxID))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	return req, nil
}

// Send sends a request built by Request and returns the response of a
// 200 answer for the caller to stream; any other answer is the daemon's
// error, and no answer a *ConnError.
func (c *Client) Send(req *http.Request, sandboxID, op string) (*http.Response, error) {
	resp, err := c.roundTrip(req)
	if err != nil {
		return nil, connError(Call{SandboxID: sandboxID, Op: op}, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, Failure(op, resp.StatusCode, raw)
	}
	return resp, nil
}

// BaseURL is the daemon's HTTP address.
func BaseURL(ep api.Endpoint) (string, error) {
	host := ep.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if ep.Port <= 0 || ep.Port > 65535 {
		return "", api.Errorf(api.KindInvalidRequest, nil, "daemon endpoint has no valid port (%d)", ep.Port)
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(ep.Port)), nil
}

// Health is what the daemon's /health says about itself and its store.
type Health struct {
	Status          string `json:"status"`
	Sessions        int    `json:"sessions"`
	ManifestVersion int64  `json:"manifest_version"`
	LayerCount      int    `json:"layer_count"`
}

// Health asks a daemon's /health (with the token, so it reports the store).
func (c *Client) Health(ctx context.Context, sandboxID string, ep api.Endpoint) (Health, error) {
	var h Health
	req, err := c.Request(ctx, http.MethodGet, sandboxID, ep, "/health", nil, "")
	if err != nil {
		return h, err
	}
	resp, err := c.Send(req, sandboxID, "health")
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return h, connError(Call{SandboxID: sandboxID, Op: "health"}, err)
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, api.Errorf(api.KindInternal, nil, "the daemon's health answer does not decode: %v", err)
	}
	return h, nil
}

// readStream reads a streamed answer: line frames go to progress, the
// result or error frame ends it.
func readStream(r io.Reader, call Call, progress func(api.OutputLine)) (json.RawMessage, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := jsonl.ReadLine(br, MaxResponse)
		if err != nil {
			if err == jsonl.ErrTooLarge {
				return nil, api.Errorf(api.KindInternal, nil, "a frame of the daemon's answer to %s exceeds %d bytes", call.Op, MaxResponse)
			}
			return nil, &ConnError{SandboxID: call.SandboxID, Op: call.Op, Err: fmt.Errorf("the stream ended without a result: %w", err)}
		}
		var f struct {
			Line   *api.OutputLine `json:"line"`
			Result json.RawMessage `json:"result"`
			Error  *api.Error      `json:"error"`
		}
		if err := json.Unmarshal(line, &f); err != nil {
			return nil, api.Errorf(api.KindInternal, nil, "a frame of the daemon's answer to %s does not decode: %v", call.Op, err)
		}
		switch {
		case f.Line != nil:
			progress(*f.Line)
		case f.Error != nil:
			if f.Error.Details == nil {
				f.Error.Details = map[string]any{}
			}
			return nil, f.Error
		case f.Result != nil:
			return f.Result, nil
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
