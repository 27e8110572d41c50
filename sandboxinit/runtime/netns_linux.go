package runtime

import (
	"context"
	"fmt"
	"net"
	goruntime "runtime"

	"golang.org/x/sys/unix"

	"github.com/vishvananda/netns"
)

// attachNetns opens isolated session s's network namespace (through its
// init, alive now) and writes its own input rules there. The handle is kept
// until teardown, so a dial never lands in a namespace a reused pid names.
func (r *Runtime) attachNetns(s *Session) error {
	pid, err := s.c.initPid()
	if err != nil {
		return err
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("open the network namespace of %s: %w", s.spec.ID, err)
	}
	if err := isolateNetns(int(ns)); err != nil {
		_ = ns.Close()
		return err
	}
	r.netsMu.Lock()
	old, had := r.netns[s.spec.ID]
	r.netns[s.spec.ID] = ns
	r.netsMu.Unlock()
	if had {
		_ = old.Close()
	}
	return nil
}

func (r *Runtime) detachNetns(id string) {
	r.netsMu.Lock()
	ns, ok := r.netns[id]
	delete(r.netns, id)
	r.netsMu.Unlock()
	if ok {
		_ = ns.Close()
	}
}

// DialContext connects to address ("host:port"; the session's own address
// or a loopback one) from inside isolated session s's network namespace:
// the daemon's forward route. Nothing in the sandbox's namespace can open
// a connection to an isolated session (firewall_linux.go), the daemon
// included.
func (s *Session) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	s.r.netsMu.Lock()
	ns, ok := s.r.netns[s.spec.ID]
	if ok {
		// A copy: teardown may close the map's handle meanwhile.
		dup, err := netnsDup(ns)
		if err != nil {
			s.r.netsMu.Unlock()
			return nil, err
		}
		ns = dup
	}
	s.r.netsMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("session %s has no network namespace of its own", s.spec.ID)
	}
	defer ns.Close()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The socket is created on this thread, in ns; the thread goes
		// back to the sandbox's namespace, or dies with the goroutine
		// (never unlocked) when it cannot.
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("own network namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			ch <- result{nil, fmt.Errorf("enter the network namespace of %s: %w", s.spec.ID, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, address)
		if netns.Set(orig) == nil {
			goruntime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	res := <-ch
	return res.c, res.err
}

func netnsDup(ns netns.NsHandle) (netns.NsHandle, error) {
	fd, err := unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("duplicate a network namespace handle: %w", err)
	}
	return netns.NsHandle(fd), nil
}
