package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// netprobe.py runs in the sessions (Debian image): TCP and UDP servers and
// clients and a name lookup, each failing with exit 1 within 2 s.
const netprobe = `import socket, sys, os, http.server, functools
cmd = sys.argv[1]
if cmd == "http":  # http PORT NAME: serve who.txt = NAME on IPv4 and IPv6
    d = "www-" + sys.argv[2]
    os.makedirs(d, exist_ok=True)
    open(d + "/who.txt", "w").write(sys.argv[3] + "\n")
    class S(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6
        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()
    class H(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):  # no stderr: it is the old daemon's pipe after a restart
            pass
    h = functools.partial(H, directory=d)
    S(("::", int(sys.argv[2])), h).serve_forever()
elif cmd == "get":  # get HOST PORT [SCOPE]: print who.txt
    host, port = sys.argv[2], int(sys.argv[3])
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(2)
    addr = (host, port) if fam == socket.AF_INET else (host, port, 0, socket.if_nametoindex(sys.argv[4]))
    s.connect(addr)
    s.sendall(b"GET /who.txt HTTP/1.0\r\nHost: x\r\n\r\n")
    data = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        data += b
    print(data.split(b"\r\n\r\n", 1)[1].decode().strip())
elif cmd == "udp-listen":  # udp-listen PORT FILE: append every datagram
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(sys.argv[2])))
    while True:
        b, _ = s.recvfrom(4096)
        with open(sys.argv[3], "a") as f:
            f.write(b.decode() + "\n")
elif cmd == "udp-send":  # udp-send HOST PORT MSG
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(sys.argv[4].encode(), (sys.argv[2], int(sys.argv[3])))
elif cmd == "raw-udp":  # raw-udp IFACE DSTMAC SRC DST PORT MSG: a frame written with a packet socket
    import struct
    iface, mac, src, dst, port, msg = sys.argv[2], bytes.fromhex(sys.argv[3].replace(":", "")), sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7].encode()
    udp = struct.pack("!HHHH", 40000, port, 8 + len(msg), 0) + msg
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
    c = sum(struct.unpack("!10H", hdr))
    c = (c & 0xffff) + (c >> 16)
    c = (c & 0xffff) + (c >> 16)
    hdr = hdr[:10] + struct.pack("!H", ~c & 0xffff) + hdr[12:]
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    own = open("/sys/class/net/" + iface + "/address").read().strip()
    s.send(mac + bytes.fromhex(own.replace(":", "")) + b"\x08\x00" + hdr + udp)
elif cmd == "resolve":  # resolve NAME: print its IPv4 addresses
    print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[2], 80, socket.AF_INET)})))
elif cmd == "ll6":  # ll6: this namespace's link-local address on eth0, or nothing
    for line in open("/proc/net/if_inet6"):
        f = line.split()
        if f[5] == "eth0" and f[0].startswith("fe80"):
            print(":".join(f[0][i:i+4] for i in range(0, 32, 4)))
`

// probe runs netprobe.py in session ws and returns its output and whether
// it succeeded.
func (sb *sandbox) probe(ws string, args ...string) (string, bool) {
	sb.t.Helper()
	out := sb.exec(ws, "timeout 10 python3 netprobe.py "+strings.Join(args, " ")+" 2>&1")
	s, _ := out["output"].(string)
	s = strings.TrimSpace(s)
	sb.t.Logf("probe %v in %s: %q (exit %v)", args, ws, s, out["exit_code"])
	return s, out["exit_code"] == float64(0)
}

func (sb *sandbox) background(ws string, args ...string) {
	sb.t.Helper()
	out := sb.ok("exec_command", map[string]any{"cmd": "python3 netprobe.py " + strings.Join(args, " "),
		"workspace_session_id": ws, "yield_time_ms": 300})
	require.Equal(sb.t, "running", out["status"], "%v: %v", args, out)
}

// A shared session shares the daemon's network namespace, yet reaches no
// isolated session: not over TCP, UDP, IPv6 link-local or a frame written
// onto the veth with a packet socket (NET_RAW), while the
// daemon's forward route still does and the isolated session's own egress
// (to the shared session's server) works; isolated sessions still do not
// reach each other. Isolated sessions resolve names through the daemon
// (Docker's embedded DNS on the test's own network: the sandbox's container
// name and a second container's alias), except with egress none; an
// allow-list session resolves but connects only where its list allows.
// All of it holds after a daemon restart, with the rules not duplicated.
func TestSharedSessionsCannotReachIsolatedOnes(t *testing.T) {
	requireDocker(t)
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	suffix := hex.EncodeToString(rb[:])
	network, peer, alias := "eos-e2e-net-"+suffix, "eos-e2e-peer-"+suffix, "eos-peer-"+suffix
	docker(t, "network", "create", "--label", "eos.test=e2e", network)
	t.Cleanup(func() { _ = exec.Command("docker", "network", "rm", network).Run() })
	docker(t, "run", "-d", "--name", peer, "--label", "eos.test=e2e", "--network", network, "--network-alias", alias,
		"--cap-drop", "ALL", images[1], "sh", "-c", "mkdir /w && echo peer > /w/who.txt && exec python3 -m http.server 8099 -d /w")
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", peer).Run() })

	tree := baseTree()
	tree["netprobe.py"] = netprobe
	// IPv6 on: the veths get link-local addresses, a path to close too.
	sb := startSandbox(t, images[1], tree, "--network", network,
		"--sysctl", "net.ipv6.conf.all.disable_ipv6=0", "--sysctl", "net.ipv6.conf.default.disable_ipv6=0")

	shared := sb.session(nil)
	iso, ipIso, gwIso, _ := sb.isolatedSession(map[string]any{})
	other, _, gwOther, _ := sb.isolatedSession(map[string]any{})
	none, _, _, _ := sb.isolatedSession(map[string]any{"egress": "none"})
	list, _, _, _ := sb.isolatedSession(map[string]any{"egress": []string{"10.200.0.0/16:1"}})
	sb.background(iso, "http", "8080", "iso")
	sb.background(iso, "udp-listen", "9000", "udp.log")
	sb.background(shared, "http", "8081", "shared")

	round := 0
	check := func(when string) {
		t.Helper()
		round++
		require.Eventually(t, func() bool { s, ok := sb.probe(iso, "get", "127.0.0.1", "8080"); return ok && s == "iso" },
			20*time.Second, 200*time.Millisecond, "%s: the isolated session's server", when)
		require.Eventually(t, func() bool { s, ok := sb.probe(shared, "get", "127.0.0.1", "8081"); return ok && s == "shared" },
			20*time.Second, 200*time.Millisecond, "%s: the shared session's server", when)
		require.Equal(t, "iso\n", sb.forward(iso, 8080), "%s: the daemon's forward route", when)

		_, ok := sb.probe(shared, "get", ipIso, "8080")
		require.False(t, ok, "%s: a shared session reached an isolated session over TCP", when)
		_, ok = sb.probe(other, "get", ipIso, "8080")
		require.False(t, ok, "%s: an isolated session reached another", when)
		s, ok := sb.probe(other, "get", gwOther, "8081")
		require.True(t, ok && s == "shared", "%s: an isolated session's egress to a shared session's server: %q", when, s)

		if ll, _ := sb.probe(iso, "ll6"); ll != "" {
			links := sb.exec(shared, "ls /sys/class/net | grep '^eos-'")["output"].(string)
			for _, l := range strings.Fields(links) {
				_, ok := sb.probe(shared, "get", ll, "8080", l)
				require.False(t, ok, "%s: a shared session reached an isolated one at %s%%%s", when, ll, l)
			}
		} else {
			t.Logf("%s: the isolated session has no IPv6 link-local address", when)
		}

		fromShared, fromOther, self := fmt.Sprintf("shared-%d", round), fmt.Sprintf("other-%d", round), fmt.Sprintf("self-%d", round)
		// The listener is up (its own datagrams arrive) before the ones
		// that must not: sent before it bound, they would prove nothing.
		ready := fmt.Sprintf("ready-%d", round)
		require.Eventually(t, func() bool {
			sb.probe(iso, "udp-send", "127.0.0.1", "9000", ready)
			return strings.Contains(fmt.Sprint(sb.exec(iso, "cat udp.log 2>/dev/null || true")["output"]), ready)
		}, 20*time.Second, 200*time.Millisecond, "%s: the UDP listener", when)
		// The sandbox's output chain refuses a shared session's datagram
		// at sendto (EPERM); another isolated session's is dropped on the
		// way. Either way it must never arrive.
		sb.probe(shared, "udp-send", ipIso, "9000", fromShared)
		sb.probe(other, "udp-send", ipIso, "9000", fromOther)
		// NET_RAW: a frame written straight onto the isolated session's
		// veth, past the sandbox's output chain (the session's own table
		// stops it).
		mac := strings.TrimSpace(sb.exec(iso, "cat /sys/class/net/eth0/address")["output"].(string))
		for _, l := range strings.Fields(sb.exec(shared, "ls /sys/class/net | grep '^eos-' || true")["output"].(string)) {
			_, ok := sb.probe(shared, "raw-udp", l, mac, gwIso, ipIso, "9000", "shared-raw")
			require.True(t, ok, "%s: the packet socket write itself", when)
		}
		_, ok = sb.probe(iso, "udp-send", "127.0.0.1", "9000", self)
		require.True(t, ok)
		var got string
		require.Eventually(t, func() bool { got = sb.read(iso, "udp.log"); return strings.Contains(got, self) },
			10*time.Second, 100*time.Millisecond, "%s: the UDP listener got its own datagram", when)
		require.NotContains(t, got, "shared-", "%s: a shared session's UDP datagram reached an isolated session", when)
		require.NotContains(t, got, "other-", "%s: an isolated session's UDP datagram reached another", when)

		for _, name := range []string{alias, sb.name} {
			addr, ok := sb.probe(iso, "resolve", name)
			require.True(t, ok && addr != "", "%s: an isolated session resolves %s: %q", when, name, addr)
			_, ok = sb.probe(list, "resolve", name)
			require.True(t, ok, "%s: an allow-list session resolves %s", when, name)
			_, ok = sb.probe(none, "resolve", name)
			require.False(t, ok, "%s: an egress none session resolved %s", when, name)
		}
		s, ok = sb.probe(iso, "get", alias, "8099")
		require.True(t, ok && s == "peer", "%s: an isolated session connects by name: %q", when, s)
		_, ok = sb.probe(list, "get", alias, "8099")
		require.False(t, ok, "%s: an allow-list session connected where its list does not allow", when)
		s, ok = sb.probe(shared, "get", alias, "8099")
		require.True(t, ok && s == "peer", "%s: a shared session still resolves and connects: %q", when, s)
	}
	check("at start")

	sb.restartDaemon()
	check("after a daemon restart")

	pid := docker(t, "inspect", "-f", "{{.State.Pid}}", sb.name)
	out, err := exec.Command("nsenter", "-t", pid, "-n", "nft", "list", "table", "inet", "eos").CombinedOutput()
	require.NoError(t, err, "%s", out)
	rules := string(out)
	t.Log(rules)
	require.Equal(t, 1, strings.Count(rules, "hook output"), "one output chain")
	require.Equal(t, 1, strings.Count(rules, "\t"+`oifname "eos-*" drop`), "no duplicate rules after a restart")
}
