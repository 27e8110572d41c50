package runtime

// Name resolution for isolated sessions. The sandbox's resolver is often
// loopback in the sandbox's network namespace (Docker's embedded DNS at
// 127.0.0.11 on user-defined networks), which a session's own namespace
// cannot reach. So the daemon relays: a forwarder per isolated session on
// its gateway address, port 53, UDP and TCP, to the sandbox's nameservers;
// the session's /etc/resolv.conf names the gateway. A session with egress
// none gets neither (it resolves nothing); an allow-list session may
// resolve any name (its input chain accepts the gateway's port 53), while
// what it connects to is still filtered.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// sandboxResolvConf is the sandbox's resolver configuration (a variable for
// the tests).
var sandboxResolvConf = "/etc/resolv.conf"

// dnsForwarder serves one session's gateway address.
type dnsForwarder struct {
	servers []*dns.Server
}

// upstreams reads the sandbox's nameservers each time (Docker may rewrite
// the file); none configured means every query fails with SERVFAIL.
func upstreams() []string {
	cfg, err := dns.ClientConfigFromFile(sandboxResolvConf)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(cfg.Servers))
	for _, s := range cfg.Servers {
		out = append(out, net.JoinHostPort(s, cfg.Port))
	}
	return out
}

// relay answers q with the first upstream's answer over network ("udp" or
// "tcp"); a truncated UDP answer is passed on as is so the client retries
// over TCP.
func relay(network string) dns.HandlerFunc {
	c := &dns.Client{Net: network, Timeout: 4 * time.Second}
	return func(w dns.ResponseWriter, q *dns.Msg) {
		for _, up := range upstreams() {
			resp, _, err := c.Exchange(q, up)
			if err == nil && resp != nil {
				resp.Id = q.Id
				_ = w.WriteMsg(resp)
				return
			}
		}
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeServerFailure)
		_ = w.WriteMsg(m)
	}
}

// startDNS listens on gateway:port (UDP and TCP; port "0" for any) and relays.
func startDNS(gateway, port string) (*dnsForwarder, error) {
	addr := net.JoinHostPort(gateway, port)
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return nil, fmt.Errorf("dns forwarder on %s: %w", addr, err)
	}
	if port == "0" { // the tests: TCP on the port UDP got
		addr = pc.LocalAddr().String()
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		_ = pc.Close()
		return nil, fmt.Errorf("dns forwarder on %s: %w", addr, err)
	}
	f := &dnsForwarder{servers: []*dns.Server{
		{PacketConn: pc, Handler: relay("udp")},
		{Listener: ln, Handler: relay("tcp"), ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second},
	}}
	var wg sync.WaitGroup
	for _, s := range f.servers {
		wg.Add(1)
		s.NotifyStartedFunc = wg.Done
		go func() { _ = s.ActivateAndServe() }()
	}
	wg.Wait()
	return f, nil
}

// addr is where the forwarder listens for network "udp" or "tcp".
func (f *dnsForwarder) addr(network string) string {
	if network == "tcp" {
		return f.servers[1].Listener.Addr().String()
	}
	return f.servers[0].PacketConn.LocalAddr().String()
}

func (f *dnsForwarder) close() {
	for _, s := range f.servers {
		_ = s.Shutdown()
	}
}

// sessionResolvConf is the /etc/resolv.conf of a session: the sandbox's for
// a shared one; for an isolated one the sandbox's search and options with
// the gateway as its only nameserver, or no nameserver for egress none.
func sessionResolvConf(isolated bool, e Egress, gateway string) []byte {
	b, err := os.ReadFile(sandboxResolvConf)
	if err != nil {
		b = nil
	}
	if !isolated {
		return b
	}
	var out bytes.Buffer
	if e.None {
		out.WriteString("# egress none: this session resolves no names\n")
	} else {
		out.WriteString("# the daemon's resolver for this session (it relays to the sandbox's)\nnameserver " + gateway + "\n")
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "search" || f[0] == "domain" || f[0] == "options") {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}

// startSessionDNS starts id's forwarder (replacing one left over) unless
// its egress is none.
func (r *Runtime) startSessionDNS(id string, e Egress, gateway string) error {
	r.stopSessionDNS(id)
	if e.None {
		return nil
	}
	f, err := startDNS(gateway, "53")
	if err != nil {
		return err
	}
	r.netsMu.Lock()
	r.dns[id] = f
	r.netsMu.Unlock()
	return nil
}

func (r *Runtime) stopSessionDNS(id string) {
	r.netsMu.Lock()
	f := r.dns[id]
	delete(r.dns, id)
	r.netsMu.Unlock()
	if f != nil {
		f.close()
	}
}
