package daemonclient

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// The direct path: a daemon on this machine is published by Docker on a
// loopback port, which its userland proxy (docker-proxy) relays to the
// container: two more hops and a process in every call (measured: 0.5 ms
// of a 2 ms exec). Where the caller knows the daemon's address on its
// container network (Call.Direct, from Docker's inspect of the container)
// and that address answers, the call goes there instead, with the
// published endpoint as its Host (the daemon answers loopback names only).
// An address that cannot be dialled is not tried again by this client for
// directRetryAfter (a restarting container's daemon is back on the same
// address within seconds, usually), and that call goes on to the
// published endpoint: a dial that fails sent nothing.

// directDialTimeout bounds a dial of a direct address: a container network
// the caller cannot route to (rootless Docker, another host's) must not
// hold up the call.
const directDialTimeout = 300 * time.Millisecond

// directRetryAfter is how long an address that failed is left alone.
const directRetryAfter = 30 * time.Second

// directs remembers the direct addresses in use, and those that failed.
type directs struct {
	mu   sync.Mutex
	live map[string]bool      // dialling now or known good: dial with directDialTimeout
	bad  map[string]time.Time // when it last failed
}

func (d *directs) usable(addr string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if at, ok := d.bad[addr]; ok {
		if time.Since(at) < directRetryAfter {
			return false
		}
		delete(d.bad, addr)
	}
	if d.live == nil {
		d.live = map[string]bool{}
	}
	d.live[addr] = true
	return true
}

func (d *directs) failed(addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.bad == nil {
		d.bad = map[string]time.Time{}
	}
	d.bad[addr] = time.Now()
	delete(d.live, addr)
}

func (d *directs) isDirect(addr string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live[addr]
}

// dialer wraps dial: a direct address gets directDialTimeout.
func (d *directs) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if d.isDirect(addr) {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, directDialTimeout)
			defer cancel()
		}
		return dial(ctx, network, addr)
	}
}

// directAddr is the host:port of call's direct path, or "" when it has
// none: it goes through a forwarder, names no direct address, or this
// client saw that one fail.
func (c *Client) directAddr(call Call) string {
	if call.Via != nil || call.Direct == nil || c.direct == nil {
		return ""
	}
	ip := net.ParseIP(call.Direct.Host)
	if ip == nil || ip.IsUnspecified() || call.Direct.Port <= 0 || call.Direct.Port > 65535 {
		return ""
	}
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(call.Direct.Port))
	if !c.direct.usable(addr) {
		return ""
	}
	return addr
}

// UseDirect points req (built by Request for the published endpoint) at
// the daemon's direct address d when it dials: for a request whose body
// cannot be sent twice (a stream), so it is dialled first, once per
// address. It reports whether req goes direct.
func (c *Client) UseDirect(ctx context.Context, req *http.Request, d *api.Endpoint) bool {
	addr := c.directAddr(Call{Direct: d})
	if addr == "" {
		return false
	}
	dctx, cancel := context.WithTimeout(ctx, directDialTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err != nil {
		c.direct.failed(addr)
		return false
	}
	_ = conn.Close()
	goDirect(req, addr)
	return true
}

// goDirect points req at addr, keeping the published endpoint as its Host.
func goDirect(req *http.Request, addr string) {
	req.Host = req.URL.Host
	req.URL.Host = addr
}

// dialFailed reports whether err is a connection that was never made.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// DirectOf is where a daemon listens on its container's network, for
// Call.Direct: the container's address on it and the daemon's port there.
func DirectOf(ip string, port int) *api.Endpoint {
	if net.ParseIP(ip) == nil || port <= 0 || port > 65535 {
		return nil
	}
	return &api.Endpoint{Host: ip, Port: port}
}
