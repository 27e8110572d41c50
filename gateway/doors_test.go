package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// TestForeignHostRefused: a request naming a Host the gateway does not
// serve (DNS rebinding) is refused before auth; the loopback spellings of
// the listening address are served; no CORS grant is sent.
func TestForeignHostRefused(t *testing.T) {
	_, _, addr := start(t)
	_, port, _ := net.SplitHostPort(addr)
	for host, want := range map[string]int{
		addr:                   http.StatusOK,
		"localhost:" + port:    http.StatusOK,
		"[::1]:" + port:        http.StatusOK,
		"evil.example":         http.StatusMisdirectedRequest,
		"evil.example:" + port: http.StatusMisdirectedRequest,
		"127.0.0.1:1":          http.StatusMisdirectedRequest,
	} {
		for _, path := range []string{"/healthz", "/v1/ops"} {
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
			req.Host = host
			req.Header.Set("Authorization", "Bearer "+testToken)
			req.Header.Set("Origin", "http://evil.example")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if want == http.StatusOK {
				require.NotEqual(t, http.StatusMisdirectedRequest, resp.StatusCode, "%s %s", host, path)
			} else {
				require.Equal(t, want, resp.StatusCode, "%s %s", host, path)
			}
			require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))
		}
	}
}

// TestIdleConnectionsDoNotBlock: 300 idle connections (270 keep-alive HTTP
// connections between requests, 30 that never send a byte)
// do not keep a real client out, although the HTTP cap is 256.
func TestIdleConnectionsDoNotBlock(t *testing.T) {
	_, _, addr := start(t)
	begin := time.Now()
	var idle []net.Conn
	t.Cleanup(func() {
		for _, c := range idle {
			c.Close()
		}
	})
	for i := range 300 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		idle = append(idle, c)
		if i%10 == 0 {
			continue // silent: never sends a byte
		}
		_, err = fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
		require.NoError(t, err)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue // closed to make room: that is the point
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := cl.Get("http://" + addr + "/healthz")
	require.NoError(t, err, "a real client is served next to 300 idle connections")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Less(t, time.Since(start), 5*time.Second)
	// Idle connections make room at once: nobody waits for a timeout.
	require.Less(t, time.Since(begin), 8*time.Second, "the connections over the cap waited for idle ones to time out")
	// And over JSON lines.
	out := rawLine(t, addr, []byte(`{"op":"list_sandboxes","scope":{"kind":"system"},"args":{},"_sandbox_gateway_auth_token":"`+testToken+`"}`+"\n"))
	require.Equal(t, "list_sandboxes", out["op"])
}

// TestJSONLinePanicRecovered: a panic while serving a JSON line is an
// internal error for that request, and the gateway goes on serving.
func TestJSONLinePanicRecovered(t *testing.T) {
	addr := startWith(t, &fakeBackend{}, func(s *Server) {
		s.lineHook = func(r *jsonl.Request) {
			if r.RequestID == "boom" {
				panic("handler exploded")
			}
		}
	})
	line := func(rid string) []byte {
		return []byte(`{"op":"list_sandboxes","scope":{"kind":"system"},"args":{},"request_id":"` + rid + `","_sandbox_gateway_auth_token":"` + testToken + `"}` + "\n")
	}
	out := rawLine(t, addr, line("boom"))
	e, _ := out["error"].(map[string]any)
	require.Equal(t, string(api.KindInternal), e["kind"], "%v", out)
	require.Equal(t, "list_sandboxes", rawLine(t, addr, line("fine"))["op"], "the gateway still serves")
	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
}

// blockingBackend holds a lifecycle op until its context ends.
type blockingBackend struct {
	fakeBackend
	started, ended chan struct{}
}

func (b *blockingBackend) Lifecycle(ctx context.Context, op, id string, args map[string]any) (any, error) {
	close(b.started)
	<-ctx.Done()
	close(b.ended)
	return nil, ctx.Err()
}

// TestJSONLineDisconnectCancels: a client that resets its connection
// ends the request's context.
func TestJSONLineDisconnectCancels(t *testing.T) {
	b := &blockingBackend{started: make(chan struct{}), ended: make(chan struct{})}
	addr := startWith(t, b, nil)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = c.Write([]byte(`{"op":"list_sandboxes","scope":{"kind":"system"},"args":{},"_sandbox_gateway_auth_token":"` + testToken + `"}` + "\n"))
	require.NoError(t, err)
	select {
	case <-b.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the op never started")
	}
	require.NoError(t, c.(*net.TCPConn).SetLinger(0)) // close with a reset
	c.Close()
	select {
	case <-b.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the op's context did not end when the client went away")
	}
}

// flakyListener fails its first Accepts with EMFILE.
type flakyListener struct {
	net.Listener
	fails atomic.Int64
}

func (f *flakyListener) Accept() (net.Conn, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return f.Listener.Accept()
}

// TestAcceptErrorsAreRetried: running out of file descriptors does not
// close the door; the gateway serves once descriptors are back.
func TestAcceptErrorsAreRetried(t *testing.T) {
	s := New(&fakeBackend{}, testToken, nil)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fl := &flakyListener{Listener: inner}
	fl.fails.Store(5)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, fl) }()
	t.Cleanup(func() { cancel(); inner.Close(); <-done })
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get("http://" + inner.Addr().String() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	select {
	case err := <-done:
		t.Fatalf("Serve returned: %v", err)
	default:
	}
}

// TestStalledReaderIsDropped: a stream to a client that stopped reading
// fails its writes after the write timeout instead of blocking forever.
func TestStalledReaderIsDropped(t *testing.T) {
	failed := make(chan error, 1)
	h := writeDeadlines(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				failed <- err
				return
			}
			w.(http.Flusher).Flush()
		}
	}), 300*time.Millisecond)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", l.Addr())
	require.NoError(t, err)
	select { // the client never reads
	case err := <-failed:
		require.Error(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the handler is still blocked writing to a client that does not read")
	}
}

// TestUnixSocketServesAnyHost: a unix socket is out of a browser's reach,
// so its clients (curl --unix-socket, the CLIs) may send any Host.
func TestUnixSocketServesAnyHost(t *testing.T) {
	s := New(&fakeBackend{}, testToken, nil)
	sock := filepath.Join(t.TempDir(), "gw.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); l.Close(); <-done })
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}
	for _, host := range []string{"localhost", "evil.example"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/healthz", nil)
		resp, err := cl.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.NotEqual(t, http.StatusMisdirectedRequest, resp.StatusCode, host)
	}
}
