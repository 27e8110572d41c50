package runtime

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// linkNames are the names of an isolated session's veth pair in the
// sandbox's network namespace: host stays there, peer is moved into the
// session and renamed eth0. Interface names have at most 15 bytes.
func linkNames(id string) (host, peer string) {
	short := id
	if len(short) > 10 {
		h := fnv.New32a()
		_, _ = h.Write([]byte(id))
		short = fmt.Sprintf("%s%05x", id[:5], h.Sum32()&0xfffff)
	}
	return "eos-" + short, "eoc-" + short
}

// usedSubnets collects the /30s of addrPrefix already assigned to any
// interface in the sandbox's network namespace.
func usedSubnets() (map[int]bool, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	used := make(map[int]bool)
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || !addrPrefix.Contains(ip) {
			continue
		}
		b := ip.As4()
		used[(int(b[2])<<8|int(b[3]))/4] = true
	}
	return used, nil
}

// pickSubnet returns want when it is free (or already ours), or the first
// free /30 starting at a hash of id, so ids tend to keep their subnet.
func pickSubnet(id string, want *subnet, used map[int]bool) (subnet, error) {
	if want != nil {
		if used[want.index] {
			return subnet{}, fmt.Errorf("address %s is in use in the sandbox", want.session())
		}
		return *want, nil
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	start := int(h.Sum32() % subnetCount)
	for i := range subnetCount {
		idx := (start + i) % subnetCount
		if idx == 0 { // 10.200.0.0/30 is left out so no session gets the pool's first address
			continue
		}
		if !used[idx] {
			return subnet{index: idx}, nil
		}
	}
	return subnet{}, fmt.Errorf("no free /30 left in %s", addrPrefix)
}

// createVeth creates the pair for session id with its addresses: the host end
// is up with the gateway address, the peer carries the session address
// (libcontainer keeps permanent global addresses when it moves the device).
func createVeth(id string, sn subnet) (*netSpec, error) {
	host, peer := linkNames(id)
	// A pair left behind by a crash between creation and container start.
	_ = deleteVeth(id)
	la := netlink.NewLinkAttrs()
	la.Name = host
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peer}); err != nil {
		return nil, fmt.Errorf("create veth %s/%s: %w", host, peer, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = deleteVeth(id)
		}
	}()
	mask := net.CIDRMask(30, 32)
	for _, x := range []struct {
		name string
		addr netip.Addr
		up   bool
	}{{host, sn.gateway(), true}, {peer, sn.session(), false}} {
		l, err := netlink.LinkByName(x.name)
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", x.name, err)
		}
		ipn := &net.IPNet{IP: net.IP(x.addr.AsSlice()), Mask: mask}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return nil, fmt.Errorf("address %s on %s: %w", ipn, x.name, err)
		}
		if x.up {
			if err := netlink.LinkSetUp(l); err != nil {
				return nil, fmt.Errorf("set %s up: %w", x.name, err)
			}
		}
	}
	ok = true
	return &netSpec{peer: peer, addr: sn.session().String(), gateway: sn.gateway().String()}, nil
}

// deleteVeth removes the sandbox end of id's pair (which removes the peer);
// a missing link is not an error. When the session's network namespace goes
// away the kernel deletes the pair by itself.
func deleteVeth(id string) error {
	host, peer := linkNames(id)
	for _, name := range []string{host, peer} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			continue // LinkNotFoundError, or already gone
		}
		// ENODEV: the kernel removed it meanwhile (its namespace went away).
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("delete %s: %w", name, err)
		}
	}
	return nil
}

// vethAddr returns the session address of id's live pair, from the gateway
// address on its sandbox end, or "" when there is no pair.
func vethAddr(id string) (string, error) {
	host, _ := linkNames(id)
	l, err := netlink.LinkByName(host)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return "", nil
		}
		return "", fmt.Errorf("find %s: %w", host, err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return "", fmt.Errorf("addresses of %s: %w", host, err)
	}
	for _, a := range addrs {
		gw, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && addrPrefix.Contains(gw) {
			return gw.Next().String(), nil
		}
	}
	return "", nil
}

// gatewayOf returns the sandbox end of the /30 of session address addr.
func gatewayOf(addr string) (netip.Addr, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is4() || !addrPrefix.Contains(a) {
		return netip.Addr{}, fmt.Errorf("session address %q is not in %s", addr, addrPrefix)
	}
	return a.Prev(), nil
}
