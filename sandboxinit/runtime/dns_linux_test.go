package runtime

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"
)

// The resolv.conf a session gets: the sandbox's when shared; the gateway
// with the sandbox's search and options when isolated; no nameserver at all
// for egress none.
func TestSessionResolvConf(t *testing.T) {
	f := filepath.Join(t.TempDir(), "resolv.conf")
	require.NoError(t, os.WriteFile(f, []byte("nameserver 127.0.0.11\nsearch corp.example\noptions ndots:0\n"), 0o644))
	old := sandboxResolvConf
	sandboxResolvConf = f
	t.Cleanup(func() { sandboxResolvConf = old })

	require.Equal(t, "nameserver 127.0.0.11\nsearch corp.example\noptions ndots:0\n", string(sessionResolvConf(false, Egress{}, "")))
	iso := string(sessionResolvConf(true, Egress{}, "10.200.0.5"))
	require.Contains(t, iso, "\nnameserver 10.200.0.5\nsearch corp.example\noptions ndots:0\n")
	require.NotContains(t, iso, "127.0.0.11")
	none := string(sessionResolvConf(true, Egress{None: true}, "10.200.0.5"))
	require.NotContains(t, none, "nameserver")
	require.Contains(t, none, "search corp.example")
}

// The forwarder relays UDP and TCP queries to the sandbox's nameserver
// and answers SERVFAIL when none answers.
func TestDNSForwarder(t *testing.T) {
	// resolv.conf has no port: the fake upstream takes 53 on a loopback
	// address of its own (the test runs as root, as make test does).
	up, err := net.ListenPacket("udp4", "127.0.0.3:53")
	require.NoError(t, err)
	upTCP, err := net.Listen("tcp4", up.LocalAddr().String())
	require.NoError(t, err)
	answer := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A 192.0.2.7")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	})
	for _, s := range []*dns.Server{{PacketConn: up, Handler: answer}, {Listener: upTCP, Handler: answer}} {
		go func() { _ = s.ActivateAndServe() }()
		t.Cleanup(func() { _ = s.Shutdown() })
	}
	f := filepath.Join(t.TempDir(), "resolv.conf")
	require.NoError(t, os.WriteFile(f, []byte("nameserver 127.0.0.3\n"), 0o644))
	old := sandboxResolvConf
	sandboxResolvConf = f
	t.Cleanup(func() { sandboxResolvConf = old })

	fwd, err := startDNS("127.0.0.2", "0")
	require.NoError(t, err)
	t.Cleanup(fwd.close)
	for _, network := range []string{"udp", "tcp"} {
		q := new(dns.Msg)
		q.SetQuestion("peer.example.", dns.TypeA)
		resp, _, err := (&dns.Client{Net: network}).Exchange(q, fwd.addr(network))
		require.NoError(t, err, network)
		require.Len(t, resp.Answer, 1, network)
		require.Equal(t, "192.0.2.7", resp.Answer[0].(*dns.A).A.String(), network)
	}

	require.NoError(t, os.WriteFile(f, []byte("# nothing\n"), 0o644))
	q := new(dns.Msg)
	q.SetQuestion("peer.example.", dns.TypeA)
	resp, _, err := (&dns.Client{Net: "udp"}).Exchange(q, fwd.addr("udp"))
	require.NoError(t, err)
	require.Equal(t, dns.RcodeServerFailure, resp.Rcode)
}
