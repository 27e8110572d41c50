package runtime

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
)

// inNetns runs f on a thread inside a fresh named network namespace and
// returns a function that prints that namespace's nftables ruleset.
func inNetns(t *testing.T, f func()) (ruleset func() string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (it creates a network namespace): run it as root, as make test does")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("this test reads the ruleset with nft: apt-get install nftables")
	}
	name := fmt.Sprintf("eos-fwtest-%d", os.Getpid())
	done := make(chan struct{})
	go func() {
		defer close(done)
		goruntime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := netns.NewNamed(name)
		require.NoError(t, err)
		defer ns.Close()
		f()
	}()
	<-done
	t.Cleanup(func() { _ = netns.DeleteNamed(name) })
	return func() string {
		out, err := exec.Command("ip", "netns", "exec", name, "nft", "list", "ruleset").CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
}

// The rules as the kernel holds them: written again (a daemon restart)
// they are replaced, not duplicated; a session's table goes with Destroy.
func TestFirewallRules(t *testing.T) {
	id := "ws-abc123"
	host, _ := linkNames(id)
	rules := inNetns(t, func() {
		for range 2 {
			require.NoError(t, ensureFirewall())
			require.NoError(t, applyEgress(id, Egress{Allow: []EgressRule{{Prefix: netip.MustParsePrefix("10.1.0.0/16"), Port: 443}}}, netip.MustParseAddr("10.200.0.5")))
		}
		require.NoError(t, applyEgress("ws-none", Egress{None: true}, netip.MustParseAddr("10.200.0.9")))
		require.NoError(t, deleteEgress("ws-none"))
		require.NoError(t, deleteEgress("ws-never-had-one"))
		require.NoError(t, applyEgress("ws-default", Egress{}, netip.MustParseAddr("10.200.0.13")))
		// The table a session's own namespace gets (here: the test's).
		self, err := netns.Get()
		require.NoError(t, err)
		defer self.Close()
		for range 2 {
			require.NoError(t, isolateNetns(int(self)))
		}
	})()
	t.Log(rules)
	require.Equal(t, 1, strings.Count(rules, `iifname "eos-*" oifname "eos-*" drop`), "sessions never reach each other")
	require.Equal(t, 1, strings.Count(rules, `ip saddr 10.200.0.0/16 oifname != "eos-*" masquerade`))
	require.Contains(t, rules, "table inet eos_s_"+id)
	require.Equal(t, 2, strings.Count(rules, fmt.Sprintf(`iifname "%s" ct state established,related accept`, host)), "input and forward")
	require.Equal(t, 2, strings.Count(rules, fmt.Sprintf(`iifname "%s" ip daddr 10.1.0.0/16 tcp dport 443 accept`, host)))
	require.Equal(t, 2, strings.Count(rules, fmt.Sprintf(`iifname "%s" ip daddr 10.1.0.0/16 udp dport 443 accept`, host)))
	require.Equal(t, 2, strings.Count(rules, fmt.Sprintf(`iifname "%s" drop`, host)))
	require.Equal(t, 1, strings.Count(rules, `oifname "eos-*" ct state established,related accept`), "replies to sessions")
	require.Equal(t, 1, strings.Count(rules, "\t"+`oifname "eos-*" drop`), "anything else towards a session")
	require.Equal(t, 1, strings.Count(rules, fmt.Sprintf(`iifname "%s" ip daddr 10.200.0.5 udp dport 53 accept`, host)), "the resolver, input only")
	require.Equal(t, 1, strings.Count(rules, fmt.Sprintf(`iifname "%s" ip daddr 10.200.0.5 tcp dport 53 accept`, host)))
	require.Equal(t, 1, strings.Count(rules, "table inet eos_in"))
	require.Equal(t, 1, strings.Count(rules, `iifname "eth0" ct state established,related accept`), "in the session: replies only")
	require.Equal(t, 1, strings.Count(rules, `iifname "eth0" drop`), "in the session: nothing new from the sandbox")
	require.NotContains(t, rules, "eos_s_ws-none")
	require.NotContains(t, rules, "eos_s_ws-default", "the default policy has no table")
}

// The sandbox's ingress table as the kernel holds it: written again (a
// daemon restart) it is replaced, not duplicated; nothing new from outside
// but the daemon's port, ICMP, loopback and the sessions' veths.
// (activities' TestSandboxesCannotReachEachOther sends the traffic.)
func TestIngressGuardRules(t *testing.T) {
	rules := inNetns(t, func() {
		for range 2 {
			require.NoError(t, GuardIngress(7001))
		}
	})()
	t.Log(rules)
	require.Equal(t, 1, strings.Count(rules, "table inet "+IngressTable))
	for _, r := range []string{`iifname "lo" accept`, `iifname "eos-*" accept`, `ct state established,related accept`,
		`meta l4proto icmp accept`, `meta l4proto ipv6-icmp accept`, `tcp dport 7001 accept`} {
		require.Equal(t, 1, strings.Count(rules, r), r)
	}
	require.Equal(t, 1, strings.Count(rules, "\t\tdrop\n"), "then everything else new is dropped")
	require.Less(t, strings.Index(rules, `tcp dport 7001 accept`), strings.Index(rules, "\t\tdrop\n"), "the drop comes last")
}
