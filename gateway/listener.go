package gateway

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// Serve serves HTTP and JSON lines on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ml := &muxListener{Listener: l, s: s, conns: make(chan net.Conn), done: make(chan struct{})}
	go ml.acceptLoop()
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: LineReadTimeout, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	max := s.MaxHTTPConns
	if max <= 0 {
		max = MaxConcurrentConns
	}
	err := hs.Serve(newLimitListener(ml, max))
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

func (m *muxListener) acceptLoop() {
	for {
		c, err := m.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			m.mu.Lock()
			if m.err == nil {
				m.err = err
			}
			m.mu.Unlock()
			m.Close()
			return
		}
		go m.sniff(c)
	}
}

func (m *muxListener) sniff(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(LineReadTimeout))
	br := bufio.NewReaderSize(c, 64<<10)
	b, err := br.Peek(1)
	if err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	pc := &peekedConn{Conn: c, r: br}
	if b[0] == '{' {
		m.s.serveLine(pc)
		return
	}
	select {
	case m.conns <- pc:
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

// limitListener caps the connections it has accepted and not yet closed:
// at the cap, Accept waits for one to close (the caller's connection stays
// queued meanwhile).
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
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

// serveLine answers one JSON-lines request and closes the connection.
func (s *Server) serveLine(c net.Conn) {
	defer c.Close()
	write := func(v any) {
		_ = c.SetWriteDeadline(time.Now().Add(LineReadTimeout))
		_, _ = c.Write(jsonl.EncodeLine(v))
	}
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		write(api.Envelope{Error: api.Errorf(api.KindInternal, nil, "gateway is at connection capacity")})
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(LineReadTimeout))
	line, err := jsonl.ReadLine(c, s.MaxBody)
	if err != nil {
		if errors.Is(err, jsonl.ErrTooLarge) {
			write(api.Envelope{Error: errTooLarge(s.MaxBody)})
		} else {
			write(api.Envelope{Error: api.Errorf(api.KindBadJSON, nil, "read request: %v", err)})
		}
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	req, aerr := jsonl.DecodeRequest(line)
	if aerr != nil {
		write(api.Envelope{Error: aerr})
		return
	}
	if !s.authorized(req.Token) {
		write(api.Envelope{Error: errUnauthorized()})
		return
	}
	req.Token = ""
	req.RequestID = requestIDOr(req.RequestID)
	var progress func(string)
	if req.StreamLogs {
		progress = func(msg string) {
			_ = c.SetWriteDeadline(time.Now().Add(LineReadTimeout))
			_, _ = c.Write(CLILogFrame(msg))
		}
	}
	out, aerr := s.DispatchProgress(context.Background(), req, progress)
	if aerr != nil {
		write(api.Envelope{Error: aerr})
		return
	}
	write(out)
}
