package daemonclient

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// A call with a direct address goes there, with the published endpoint as
// its Host; an address that cannot be dialled, or that another daemon now
// answers (401), sends the call on to the published endpoint and is not
// tried again; a forwarded call never goes direct.
func TestDoDirectAndItsFallback(t *testing.T) {
	secret := []byte("s")
	var published, direct, strangers atomic.Int64
	pub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		published.Add(1)
		_, _ = w.Write([]byte(`{"via":"published"}`))
	}))
	defer pub.Close()
	pubEP := endpointOf(t, pub)
	dir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		direct.Add(1)
		require.Equal(t, pub.Listener.Addr().String(), r.Host, "the daemon sees its published name as the Host")
		require.Equal(t, "Bearer "+Token(secret, "sb"), r.Header.Get("Authorization"))
		_, _ = w.Write([]byte(`{"via":"direct"}`))
	}))
	defer dir.Close()
	c := New(secret, nil)
	call := func(d *api.Endpoint) string {
		t.Helper()
		out, used, err := c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: pubEP, Direct: d, Op: "file_read"})
		require.NoError(t, err)
		require.Equal(t, pubEP, used, "the endpoint a caller remembers stays the published one")
		return string(out)
	}
	d := endpointOf(t, dir)
	require.JSONEq(t, `{"via":"direct"}`, call(&d))
	require.JSONEq(t, `{"via":"direct"}`, call(&d))
	require.EqualValues(t, 0, published.Load())

	// Nothing listens there any more: the published endpoint answers, and
	// the address is not dialled again.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := api.Endpoint{Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}
	require.NoError(t, l.Close())
	require.JSONEq(t, `{"via":"published"}`, call(&gone))
	require.Equal(t, "", c.directAddr(Call{Endpoint: pubEP, Direct: &gone}), "a failed address is not tried again")
	// ... for a while: a restarted container's daemon is usually back on it.
	addr := net.JoinHostPort(gone.Host, strconv.Itoa(gone.Port))
	c.direct.mu.Lock()
	c.direct.bad[addr] = time.Now().Add(-directRetryAfter - time.Second)
	c.direct.mu.Unlock()
	require.Equal(t, addr, c.directAddr(Call{Endpoint: pubEP, Direct: &gone}), "tried again once it has been left alone long enough")
	c.direct.failed(addr)

	// Another daemon answers the address now: it refuses the token, and
	// the call goes on to the published endpoint, which runs it once.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		strangers.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"kind":"unauthorized","message":"missing or wrong sandbox token"}}`))
	}))
	defer other.Close()
	o := endpointOf(t, other)
	before := published.Load()
	require.JSONEq(t, `{"via":"published"}`, call(&o))
	require.EqualValues(t, 1, strangers.Load())
	require.EqualValues(t, before+1, published.Load())
	require.JSONEq(t, `{"via":"published"}`, call(&o))
	require.EqualValues(t, 1, strangers.Load(), "not asked again")

	// A malformed direct address is ignored; a call through a forwarder
	// never goes direct.
	require.Equal(t, "", c.directAddr(Call{Endpoint: pubEP, Direct: &api.Endpoint{Host: "example.com", Port: 1}}))
	require.Equal(t, "", c.directAddr(Call{Endpoint: pubEP, Direct: &d, Via: &Via{Addr: "127.0.0.1:1"}}))
	require.Nil(t, DirectOf("", 7001))
	require.Nil(t, DirectOf("10.0.0.2", 0))
	require.Equal(t, &api.Endpoint{Host: "10.0.0.2", Port: 7001}, DirectOf("10.0.0.2", 7001))
}

// UseDirect (a streamed request) dials the address first: one that answers
// gets the request, with its published Host; one that does not leaves the
// request as it was and is not dialled again.
func TestUseDirect(t *testing.T) {
	dir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer dir.Close()
	c := New([]byte("s"), nil)
	pub := api.Endpoint{Host: "127.0.0.1", Port: 1}
	req, err := c.Request(context.Background(), http.MethodPost, "sb", pub, "/import/base", nil, "")
	require.NoError(t, err)
	d := endpointOf(t, dir)
	require.True(t, c.UseDirect(context.Background(), req, &d))
	require.Equal(t, dir.Listener.Addr().String(), req.URL.Host)
	require.Equal(t, "127.0.0.1:1", req.Host)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := api.Endpoint{Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}
	require.NoError(t, l.Close())
	req, err = c.Request(context.Background(), http.MethodPost, "sb", pub, "/import/base", nil, "")
	require.NoError(t, err)
	require.False(t, c.UseDirect(context.Background(), req, &gone))
	require.Equal(t, "127.0.0.1:1", req.URL.Host, "left on the published endpoint")
	require.Equal(t, "", c.directAddr(Call{Direct: &gone}))
	require.False(t, c.UseDirect(context.Background(), req, nil))
}
