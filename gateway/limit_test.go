package gateway

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"time"
)

// startCapped serves with one HTTP connection at most, and returns a
// function that waits until the HTTP server has taken a connection (it
// holds that slot from then on).
func startCapped(t *testing.T, tweak func(*Server)) (addr string, held func()) {
	active := make(chan struct{}, 1)
	addr = startWith(t, &fakeBackend{}, func(s *Server) {
		s.MaxHTTPConns = 1
		s.httpHook = func(st http.ConnState) {
			if st == http.StateNew {
				select {
				case active <- struct{}{}:
				default:
				}
			}
		}
		if tweak != nil {
			tweak(s)
		}
	})
	return addr, func() {
		select {
		case <-active:
		case <-time.After(10 * time.Second):
			t.Fatal("no connection took the HTTP slot in 10 s")
		}
	}
}

func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 2)
	defer l.Close()
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	a, _ := l.Accept()
	b, _ := l.Accept()
	third := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			third <- c
		}
	}()
	select {
	case <-third:
		t.Fatal("accepted a connection over the cap")
	case <-time.After(100 * time.Millisecond):
	}
	a.Close()
	a.Close() // a double close releases once
	select {
	case c := <-third:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection was not accepted after one closed")
	}
	b.Close()
	// Close unblocks a waiting Accept.
	l2 := newLimitListener(inner, 1)
	l2.sem <- struct{}{}
	errc := make(chan error, 1)
	go func() { _, err := l2.Accept(); errc <- err }()
	l2.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Accept after Close succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still blocked after Close")
	}
}

func TestHTTPConnectionCap(t *testing.T) {
	addr, held := startCapped(t, nil)
	// The first connection holds the only slot with an unfinished request.
	hold, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	hold.Write([]byte("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\n"))
	held()

	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write([]byte("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n\r\n"))
	got := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
		if err != nil {
			got <- -1
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	select {
	case code := <-got:
		t.Fatalf("connection over the cap answered: %d", code)
	case <-time.After(300 * time.Millisecond):
	}
	hold.Close()
	select {
	case code := <-got:
		if code != 200 {
			t.Fatalf("status %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting connection not served after the slot freed")
	}
	// JSON lines do not count against the HTTP cap.
	if out := rawLine(t, addr, []byte(`{"op":"list_sandboxes","scope":{"kind":"system"},"args":{},"_sandbox_gateway_auth_token":"`+testToken+`"}`+"\n")); out["op"] != "list_sandboxes" {
		t.Fatalf("%v", out)
	}
}

// TestHandoffHasADeadline: an HTTP connection the server cannot take (every
// slot busy with an unfinished request) is closed after SniffTimeout
// instead of waiting forever.
func TestHandoffHasADeadline(t *testing.T) {
	addr, held := startCapped(t, func(s *Server) { s.SniffTimeout = 300 * time.Millisecond })
	hold, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	hold.Write([]byte("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\n")) // unfinished: holds the slot
	held()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection over the cap was answered")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the connection waiting for a slot was never closed")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v", d)
	}
}
