package runtime

// The sandbox's nftables rules for isolated sessions, through
// github.com/google/nftables (netlink; no nft binary needed). Every change
// is one netlink batch, which the kernel applies atomically.
//
//   - Table inet "eos" (ensureFirewall, at New): forward drops every packet
//     from one session's veth to another's ("eos-" prefix on both ends), so
//     isolated sessions have no route to each other whatever ip_forward
//     says; postrouting masquerades the sessions' pool when it leaves
//     through an interface that is not a session's, so an isolated session
//     reaches what the sandbox reaches; output drops anything new towards
//     a session's veth, by any protocol and address family, so shared
//     sessions (in the sandbox's network namespace) reach no isolated
//     session; replies of what a session opened pass (ct
//     established,related). The daemon's forward route does not need the
//     veth: it connects from inside the session's namespace (netns_linux.go).
//   - Table inet "eos_in" inside each isolated session's own namespace
//     (isolateNetns, at Start before any of its processes runs, again at
//     Load): input from eth0 accepts only ct established,related, so even a
//     frame a shared session writes onto the veth with a packet socket
//     (NET_RAW) opens nothing; the session has no NET_ADMIN to change it.
//   - Table inet "eos_s_<id>" per session with an egress policy other than
//     default (applyEgress, before the session's init starts, again at
//     Load): chains on input and forward, before "eos", that accept what
//     belongs to connections the sandbox opened (ct established,related),
//     then the allow-list, then drop everything else from the session's veth.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Egress is an isolated session's egress policy; the zero value is the
// default (the sandbox and what it reaches, never another session).
type Egress struct {
	None  bool         // nothing beyond the session's own namespace
	Allow []EgressRule // when non-empty: only these
}

// EgressRule allows TCP and UDP to Prefix (IPv4) on Port.
type EgressRule struct {
	Prefix netip.Prefix
	Port   uint16
}

func (e Egress) isDefault() bool { return !e.None && len(e.Allow) == 0 }

// ErrNoNftables wraps the failure to program nf_tables in the sandbox: the
// kernel lacks it or the sandbox lacks NET_ADMIN. Isolated sessions are then
// refused rather than started without isolation.
var ErrNoNftables = errors.New("nf_tables is not usable in the sandbox")

const (
	fwTable       = "eos"
	sessionPrefix = "eos-" // linkNames' host end
)

func sessionTable(id string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: "eos_s_" + id}
}

// ensureFirewall (re)writes table "eos" in one batch: created when
// missing, its rules replaced when present, so a restarted daemon never
// leaves a moment without them.
func ensureFirewall() error {
	c, t, err := rewriteTable(fwTable)
	if err != nil {
		return err
	}
	fwd := filterChain(c, t, "forward", nftables.ChainHookForward)
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: concat(
		ifname(expr.MetaKeyIIFNAME, sessionPrefix, false, expr.CmpOpEq),
		ifname(expr.MetaKeyOIFNAME, sessionPrefix, false, expr.CmpOpEq),
		verdict(expr.VerdictDrop))})
	out := filterChain(c, t, "output", nftables.ChainHookOutput)
	toSession := ifname(expr.MetaKeyOIFNAME, sessionPrefix, false, expr.CmpOpEq)
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: concat(toSession, ctEstablished(), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: concat(toSession, verdict(expr.VerdictDrop))})
	accept := nftables.ChainPolicyAccept
	nat := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: concat(
		ipv4(),
		ipAddr(12, addrPrefix),
		ifname(expr.MetaKeyOIFNAME, sessionPrefix, false, expr.CmpOpNeq),
		[]expr.Any{&expr.Masq{}})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: write table %s: %v", ErrNoNftables, fwTable, err)
	}
	return nil
}

// applyEgress replaces session id's egress table by one for e (none for the
// default policy), in one batch.
func applyEgress(id string, e Egress, gateway netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoNftables, err)
	}
	t := sessionTable(id)
	// add + delete: deleting a table that may not exist, in one batch.
	c.AddTable(t)
	c.DelTable(t)
	if !e.isDefault() {
		t = c.AddTable(sessionTable(id))
		host, _ := linkNames(id)
		for _, hook := range []struct {
			name string
			num  *nftables.ChainHook
		}{{"input", nftables.ChainHookInput}, {"forward", nftables.ChainHookForward}} {
			accept := nftables.ChainPolicyAccept
			ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: hook.num, Priority: nftables.ChainPriorityRef(-10), Policy: &accept})
			from := ifname(expr.MetaKeyIIFNAME, host, true, expr.CmpOpEq)
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(from, ctEstablished(), verdict(expr.VerdictAccept))})
			if !e.None && hook.name == "input" {
				// The daemon's resolver on the gateway (dns_linux.go):
				// an allow-list session resolves any name.
				for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
					c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(from, ipv4(),
						ipAddr(16, netip.PrefixFrom(gateway, 32)), l4(proto), dport(53), verdict(expr.VerdictAccept))})
				}
			}
			for _, r := range e.Allow {
				for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
					c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(from, ipv4(), ipAddr(16, r.Prefix),
						l4(proto), dport(r.Port), verdict(expr.VerdictAccept))})
				}
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(from, verdict(expr.VerdictDrop))})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: egress rules of %s: %v", ErrNoNftables, id, err)
	}
	return nil
}

// deleteEgress removes session id's egress table; a missing one is fine.
func deleteEgress(id string) error { return applyEgress(id, Egress{}, netip.Addr{}) }

// rewriteTable starts a batch that (re)writes inet table name: created when
// missing, emptied when present; the caller adds its chains and flushes,
// so the kernel swaps old rules for new at once.
func rewriteTable(name string, opts ...nftables.ConnOption) (*nftables.Conn, *nftables.Table, error) {
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrNoNftables, err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	c.FlushTable(t)
	return c, t, nil
}

// filterChain adds base chain name of type filter on hook, at the filter
// priority, accepting what no rule drops.
func filterChain(c *nftables.Conn, t *nftables.Table, name string, hook *nftables.ChainHook) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: hook, Priority: nftables.ChainPriorityFilter, Policy: &accept})
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// ifname matches an interface name: exactly (NUL-padded to IFNAMSIZ) or,
// like nft's "eos-*", by prefix.
func ifname(key expr.MetaKey, name string, exact bool, op expr.CmpOp) []expr.Any {
	data := []byte(name)
	if exact {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data}}
}

func ipv4() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
}

// ipAddr matches the IPv4 header's source (offset 12) or destination (16)
// against p.
func ipAddr(offset uint32, p netip.Prefix) []expr.Any {
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	net := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}}}
}

func dport(port uint16) []expr.Any {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, port)
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b}}
}

func ctEstablished() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}}
}

// isolateNetns (re)writes table "eos_in" in the network namespace ns (an
// isolated session's): nothing new is accepted from eth0.
func isolateNetns(ns int) error {
	c, t, err := rewriteTable("eos_in", nftables.WithNetNSFd(ns))
	if err != nil {
		return err
	}
	in := filterChain(c, t, "input", nftables.ChainHookInput)
	eth0 := ifname(expr.MetaKeyIIFNAME, "eth0", true, expr.CmpOpEq)
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: concat(eth0, ctEstablished(), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: concat(eth0, verdict(expr.VerdictDrop))})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: write the session's table eos_in: %v", ErrNoNftables, err)
	}
	return nil
}

// IngressTable is the table GuardIngress writes in the sandbox's network
// namespace.
const IngressTable = "eos_ingress"

// GuardIngress (re)writes table "eos_ingress" in the calling process's
// network namespace, the sandbox's, in one batch: input from any interface
// but loopback and the sessions' veths accepts only what belongs to
// connections the sandbox opened (ct established,related), ICMP and ICMPv6
// (echo, and the neighbour discovery an IPv6 network needs), and new TCP
// connections to port, the daemon's; everything else new from outside is
// dropped. Docker drops traffic between bridge networks, but each time it
// creates a network it deletes and re-inserts its FORWARD jumps (20.10),
// and in that moment another sandbox's packets pass: with this table a
// server in a shared session is still reached by nobody outside the
// sandbox (the daemon's token-checked /forward route reaches it from
// inside). The daemon writes it only inside its container: in a host's
// namespace it would cut the host off.
func GuardIngress(port uint16) error {
	c, t, err := rewriteTable(IngressTable)
	if err != nil {
		return err
	}
	in := filterChain(c, t, "input", nftables.ChainHookInput)
	for _, inside := range [][]expr.Any{
		ifname(expr.MetaKeyIIFNAME, "lo", true, expr.CmpOpEq),
		ifname(expr.MetaKeyIIFNAME, sessionPrefix, false, expr.CmpOpEq),
		ctEstablished(),
		l4(unix.IPPROTO_ICMP),
		l4(unix.IPPROTO_ICMPV6),
		concat(l4(unix.IPPROTO_TCP), dport(port)),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: concat(inside, verdict(expr.VerdictAccept))})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: verdict(expr.VerdictDrop)})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: write table %s: %v", ErrNoNftables, IngressTable, err)
	}
	return nil
}
