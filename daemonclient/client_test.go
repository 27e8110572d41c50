package daemonclient

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

func endpointOf(t *testing.T, srv *httptest.Server) api.Endpoint {
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	p, _ := strconv.Atoi(u.Port())
	return api.Endpoint{Host: u.Hostname(), Port: p}
}

// A daemon whose container restarted listens on another port: a refused
// call looks the endpoint up again and is answered there, once.
func TestDoFollowsARestartedDaemon(t *testing.T) {
	secret := []byte("s")
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		require.Equal(t, "Bearer "+Token(secret, "sb"), r.Header.Get("Authorization"))
		require.Equal(t, "rid-1", r.Header.Get("X-Request-Id"))
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	old := api.Endpoint{Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}
	require.NoError(t, l.Close()) // nothing listens on the old port
	var resolved atomic.Int64
	c := New(secret, func(ctx context.Context, id string) (api.Endpoint, error) {
		resolved.Add(1)
		return endpointOf(t, srv), nil
	})
	out, used, err := c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: old, Op: "file_read", RequestID: "rid-1"})
	require.NoError(t, err)
	require.JSONEq(t, `{"ok":true}`, string(out))
	require.Equal(t, endpointOf(t, srv), used)
	require.EqualValues(t, 1, calls.Load(), "the daemon ran the call once")
	require.EqualValues(t, 1, resolved.Load())

	// Without a resolver a refused call is a ConnError that says so.
	_, _, err = New(secret, nil).Do(context.Background(), Call{SandboxID: "sb", Endpoint: old, Op: "file_read"})
	var ce *ConnError
	require.ErrorAs(t, err, &ce)
	require.True(t, ce.Refused)
}

// The daemon's refusal is the *api.Error it sent; an answer that is not
// the envelope is a ResponseError; bad calls are refused before sending.
func TestDoErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/rpc/file_read":
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(api.Envelope{Error: api.Errorf(api.KindNotFound, map[string]any{"path": "x"}, "file not found: x")})
		default:
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	c := New([]byte("s"), nil)
	_, _, err := c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: endpointOf(t, srv), Op: "file_read"})
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, api.KindNotFound, ae.Kind)
	require.Equal(t, "x", ae.Details["path"])
	_, _, err = c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: endpointOf(t, srv), Op: "other"})
	var re *ResponseError
	require.ErrorAs(t, err, &re)
	require.True(t, re.Transient())
	for _, bad := range []Call{{Op: "x"}, {SandboxID: "sb", Op: "../x"}, {SandboxID: "sb", Op: "x", Args: json.RawMessage("{")}} {
		_, _, err := c.Do(context.Background(), bad)
		require.ErrorAs(t, err, &ae)
		require.Equal(t, api.KindInvalidRequest, ae.Kind)
	}
}

// While a container starts, Docker's proxy accepts a connection and drops
// it: an idempotent call is retried there, anything else is not.
func TestDoRetriesDroppedIdempotentCalls(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			c, _, err := w.(http.Hijacker).Hijack()
			require.NoError(t, err)
			_ = c.Close() // dropped without an answer
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	ep := endpointOf(t, srv)
	c := New([]byte("s"), func(context.Context, string) (api.Endpoint, error) { return ep, nil })
	out, _, err := c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: ep, Op: "file_read"})
	require.NoError(t, err)
	require.JSONEq(t, `{"ok":true}`, string(out))
	require.EqualValues(t, 2, calls.Load())

	calls.Store(0)
	_, _, err = c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: ep, Op: "exec_command"})
	require.True(t, IsConn(err), "a dropped exec_command may have run: not retried (%v)", err)
	require.EqualValues(t, 1, calls.Load())
}

// A resolver that refuses (the container is stopped) ends the call with
// its refusal at once; a resolver that keeps answering the same dead
// endpoint is asked a bounded number of times.
func TestDoResolverRefusalAndBound(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := api.Endpoint{Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}
	require.NoError(t, l.Close())
	stopped := api.Errorf(api.KindOperationFailed, map[string]any{"availability": "unavailable"}, "the container of sandbox sb is exited")
	c := New([]byte("s"), func(context.Context, string) (api.Endpoint, error) { return api.Endpoint{}, stopped })
	_, _, err = c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: dead, Op: "file_read"})
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, stopped.Message, ae.Message)

	var asked atomic.Int64
	c = New([]byte("s"), func(context.Context, string) (api.Endpoint, error) { asked.Add(1); return dead, nil })
	_, _, err = c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: dead, Op: "file_read"})
	require.True(t, IsConn(err))
	require.LessOrEqual(t, asked.Load(), int64(maxResolves))
}
