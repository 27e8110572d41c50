package gateway

import (
	"bufio"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/hostcheck"
)

// Front-door timeouts.
const (
	// SniffTimeout bounds the wait for a new connection's first byte and
	// for its handoff to the HTTP server.
	SniffTimeout = 10 * time.Second
	// IdleTimeout closes a keep-alive HTTP connection idle this long.
	IdleTimeout = 60 * time.Second
	// StreamWriteTimeout bounds each write of an SSE or JSON-lines stream:
	// a client that stops reading is dropped, not waited for.
	StreamWriteTimeout = 30 * time.Second
	// maxAcceptBackoff caps the retry delay after an Accept error such as
	// EMFILE (too many open files).
	maxAcceptBackoff = time.Second
)

// Serve serves HTTP and JSON lines on l until ctx ends. On a TCP listener
// HTTP requests must name an address l serves in their Host header (DNS
// rebinding); a unix socket is not reachable by a browser and is not
// checked.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ml := &muxListener{Listener: l, s: s, conns: make(chan net.Conn), done: make(chan struct{})}
	go ml.acceptLoop()
	var h http.Handler = writeDeadlines(s.Handler(), StreamWriteTimeout)
	if l.Addr().Network() == "tcp" {
		h = hostcheck.For(l.Addr().String()).Handler(h)
	}
	max := s.MaxHTTPConns
	if max <= 0 {
		max = MaxConcurrentConns
	}
	ll := newLimitListener(ml, max)
	hs := &http.Server{Handler: h, ReadHeaderTimeout: LineReadTimeout, IdleTimeout: IdleTimeout,
		BaseContext: func(net.Listener) context.Context { return ctx }, ConnState: ll.connState}
	if hook := s.httpHook; hook != nil {
		hs.ConnState = func(c net.Conn, st http.ConnState) { ll.connState(c, st); hook(st) }
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	err := hs.Serve(ll)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// muxListener accepts connections, sniffs each one's first byte and either
// serves it as JSON lines or hands it to the HTTP server.
type muxListener struct {
	net.Listener
	s     *Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	err   error
}

// acceptLoop accepts until the listener is closed. Any other Accept error
// (EMFILE, ENFILE, ECONNABORTED, ...) is retried with a growing delay, as
// net/http does: running out of descriptors must not close the door.
func (m *muxListener) acceptLoop() {
	var delay time.Duration
	for {
		c, err := m.Listener.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				m.mu.Lock()
				if m.err == nil {
					m.err = err
				}
				m.mu.Unlock()
				m.Close()
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), maxAcceptBackoff)
			m.s.Log.Warn("accept failed; retrying", "err", err, "retry_in_ms", delay.Milliseconds())
			select {
			case <-time.After(delay):
			case <-m.done:
				return
			}
			continue
		}
		delay = 0
		go m.sniff(c)
	}
}

// sniff reads the first byte under SniffTimeout and keeps that deadline
// through the handoff: the HTTP server sets its own deadlines once it owns
// the connection, serveLine sets the JSON-lines ones.
func (m *muxListener) sniff(c net.Conn) {
	wait := m.s.SniffTimeout
	if wait <= 0 {
		wait = SniffTimeout
	}
	deadline := time.Now().Add(wait)
	_ = c.SetReadDeadline(deadline)
	br := bufio.NewReaderSize(c, 64<<10)
	b, err := br.Peek(1)
	if err != nil {
		c.Close()
		return
	}
	pc := &peekedConn{Conn: c, r: br}
	if b[0] == '{' {
		m.s.serveLine(pc)
		return
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case m.conns <- pc:
	case <-t.C:
		c.Close() // the HTTP server did not take it in time (at capacity)
	case <-m.done:
		c.Close()
	}
}

func (m *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.err != nil {
			return nil, m.err
		}
		return nil, net.ErrClosed
	}
}

func (m *muxListener) Close() error {
	var err error
	m.once.Do(func() {
		close(m.done)
		err = m.Listener.Close()
	})
	return err
}

// limitListener caps the HTTP connections it has accepted and not yet
// closed. At the cap it first closes the connection idle the longest (a
// keep-alive connection between requests), so idle clients cannot hold
// every slot; only when none is idle does Accept wait for one to close.
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once

	mu    sync.Mutex
	idle  *list.List // of net.Conn, oldest idle first
	where map[net.Conn]*list.Element
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{}),
		idle: list.New(), where: map[net.Conn]*list.Element{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	default:
		l.evictIdle()
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

// connState tracks idle connections (http.Server.ConnState).
func (l *limitListener) connState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.where[c]; ok {
		l.idle.Remove(e)
		delete(l.where, c)
	}
	if st == http.StateIdle {
		l.where[c] = l.idle.PushBack(c)
	}
}

// evictIdle closes the oldest idle connection, if any.
func (l *limitListener) evictIdle() {
	l.mu.Lock()
	e := l.idle.Front()
	var c net.Conn
	if e != nil {
		c = l.idle.Remove(e).(net.Conn)
		delete(l.where, c)
	}
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// serveLine answers one JSON-lines request and closes the connection. A
// panic in the handler is answered as an internal error and logged; it
// never takes the gateway down. The request's context ends when the client
// resets the connection or stops taking progress frames.
func (s *Server) serveLine(c net.Conn) {
	defer c.Close()
	write := func(v any) error {
		_ = c.SetWriteDeadline(time.Now().Add(StreamWriteTimeout))
		_, err := c.Write(jsonl.EncodeLine(v))
		return err
	}
	defer func() {
		if v := recover(); v != nil {
			s.Log.Error("panic in a JSON-lines request", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			_ = write(api.Envelope{Error: api.Errorf(api.KindInternal, nil, "internal error: %v", v)})
		}
	}()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		_ = write(api.Envelope{Error: api.Errorf(api.KindInternal, nil, "gateway is at connection capacity")})
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(LineReadTimeout))
	line, err := jsonl.ReadLine(c, s.MaxBody)
	if err != nil {
		if errors.Is(err, jsonl.ErrTooLarge) {
			_ = write(api.Envelope{Error: errTooLarge(s.MaxBody)})
		} else {
			_ = write(api.Envelope{Error: api.Errorf(api.KindBadJSON, nil, "read request: %v", err)})
		}
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	req, aerr := jsonl.DecodeRequest(line)
	if aerr != nil {
		_ = write(api.Envelope{Error: aerr})
		return
	}
	if !s.authorized(req.Token) {
		_ = write(api.Envelope{Error: errUnauthorized()})
		return
	}
	req.Token = ""
	req.RequestID = requestIDOr(req.RequestID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchHangup(ctx, c, cancel)
	var progress func(string)
	if req.StreamLogs {
		progress = func(msg string) {
			_ = c.SetWriteDeadline(time.Now().Add(StreamWriteTimeout))
			if _, err := c.Write(CLILogFrame(msg)); err != nil {
				cancel() // the client is gone or stopped reading
			}
		}
	}
	s.dispatchLine(ctx, req, progress, write)
}

// dispatchLine runs the request; its own function so that a test can make
// the dispatch panic.
func (s *Server) dispatchLine(ctx context.Context, req *jsonl.Request, progress func(string), write func(any) error) {
	if s.lineHook != nil {
		s.lineHook(req)
	}
	out, aerr := s.DispatchProgress(ctx, req, progress)
	if aerr != nil {
		_ = write(api.Envelope{Error: aerr})
		return
	}
	_ = write(out)
}

// watchHangup cancels when the client resets the connection. A clean EOF
// is a half-close (the seed's clients send their line and shut down
// writing) and ends the watch; anything the client sends after its one
// line is discarded.
func watchHangup(ctx context.Context, c net.Conn, cancel func()) {
	buf := make([]byte, 512)
	for ctx.Err() == nil {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, err := c.Read(buf)
		var ne net.Error
		switch {
		case err == nil:
		case errors.As(err, &ne) && ne.Timeout():
		case errors.Is(err, io.EOF):
			return
		default:
			cancel()
			return
		}
	}
}

// writeDeadlines gives every write and flush of a response
// StreamWriteTimeout to complete, renewed each time: a stream (SSE, MCP's
// streamable HTTP) to a client that stopped reading fails instead of
// blocking its handler, while a stream that keeps moving may last. The
// deadline is lifted when the handler returns, for the next request on a
// keep-alive connection.
func writeDeadlines(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
		defer func() { _ = dw.rc.SetWriteDeadline(time.Time{}) }()
		next.ServeHTTP(dw, r)
	})
}

type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.ResponseWriter.Write(b)
}

func (d *deadlineWriter) Flush() {
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	_ = d.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// Hijack hands the connection over (the console's terminal WebSocket); gin
// asserts http.Hijacker on the writer it wraps.
func (d *deadlineWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) { return d.rc.Hijack() }
