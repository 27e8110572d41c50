package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// liveSandbox is a started sandbox with an imported base, driven through
// the activities.
type liveSandbox struct {
	t    *testing.T
	acts *Activities
	cli  *client.Client
	spec workflows.SandboxSpec
	info workflows.ContainerInfo
}

func startLiveSandbox(t *testing.T, ctx context.Context) *liveSandbox {
	t.Helper()
	acts, cli, spec := newDockerActivities(t)
	spec.WorkspaceRoot = t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(spec.WorkspaceRoot, "a.txt"), []byte("a\n"), 0o644))
	_, err := acts.CreateVolume(ctx, spec)
	require.NoError(t, err)
	_, err = acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	_, err = acts.CopyWorkspace(ctx, spec)
	require.NoError(t, err)
	info, err := acts.StartContainer(ctx, spec.SandboxID)
	require.NoError(t, err)
	readyCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, acts.WaitReady(readyCtx, spec.SandboxID, info.Daemon))
	sb := &liveSandbox{t: t, acts: acts, cli: cli, spec: spec, info: info}
	sb.call(ctx, "init_base", map[string]any{"source_dir": ImportDir, "remove_source": true})
	return sb
}

func (sb *liveSandbox) call(ctx context.Context, op string, args any) map[string]any {
	sb.t.Helper()
	raw, err := json.Marshal(args)
	require.NoError(sb.t, err)
	res, err := sb.acts.CallDaemon(ctx, workflows.DaemonCall{SandboxID: sb.spec.SandboxID, Daemon: sb.info.Daemon, Op: op, Args: raw})
	require.NoError(sb.t, err, "%s", op)
	var out map[string]any
	require.NoError(sb.t, json.Unmarshal(res, &out))
	return out
}

// get fetches who.txt from addr in session ws with busybox nc: the body, or
// "" when the connection failed within 2 s.
func (sb *liveSandbox) get(ctx context.Context, ws, host string, port int) string {
	sb.t.Helper()
	out := sb.call(ctx, "exec_command", map[string]any{"workspace_session_id": ws, "yield_time_ms": 60000,
		"cmd": fmt.Sprintf(`r=$(printf 'GET /who.txt HTTP/1.0\r\n\r\n' | busybox nc -w 2 %s %d 2>&1) && echo "$r" | tail -n 1`, host, port)})
	sb.t.Logf("GET %s:%d from %s in %s: %v (exit %v)", host, port, ws, sb.spec.SandboxID, out["output"], out["exit_code"])
	if out["exit_code"] != float64(0) {
		return ""
	}
	return strings.TrimSpace(out["output"].(string))
}

// TestSandboxesCannotReachEachOther: each sandbox is alone on a Docker
// network of its own (on Docker's default bridge they reached each other),
// so neither a shared nor an isolated session of sandbox A reaches a server
// in sandbox B, which B itself reaches on the same address. Docker's rules
// between networks have a gap (each network it creates deletes and
// re-inserts its FORWARD jumps, and a connection made then passes), so B
// itself drops what is new from outside but its daemon port: the host,
// which Docker's rules never stop, reaches B's daemon on that address and
// not the server.
func TestSandboxesCannotReachEachOther(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := startLiveSandbox(t, ctx)
	b := startLiveSandbox(t, ctx)

	c, err := b.cli.ContainerInspect(ctx, workflows.ContainerName(b.spec.SandboxID))
	require.NoError(t, err)
	require.Equal(t, networkName(b.spec.SandboxID), string(c.HostConfig.NetworkMode))
	ep := c.NetworkSettings.Networks[networkName(b.spec.SandboxID)]
	require.NotNil(t, ep, "sandbox B is on its own network: %v", c.NetworkSettings.Networks)
	require.Len(t, c.NetworkSettings.Networks, 1, "and on no other")
	ipB := ep.IPAddress
	require.NotEmpty(t, ipB)

	server := b.call(ctx, "create_workspace_session", map[string]any{})["workspace_session_id"].(string)
	b.call(ctx, "exec_command", map[string]any{"workspace_session_id": server, "yield_time_ms": 60000, "cmd": "mkdir -p www && echo B > www/who.txt"})
	run := b.call(ctx, "exec_command", map[string]any{"workspace_session_id": server, "yield_time_ms": 300, "cmd": "busybox httpd -f -p 8080 -h www"})
	require.Equal(t, "running", run["status"], "%v", run)
	require.Eventually(t, func() bool { return b.get(ctx, server, ipB, 8080) == "B" }, 10*time.Second, 200*time.Millisecond,
		"sandbox B reaches its own server on %s", ipB)

	dial := func(port int) error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ipB, strconv.Itoa(port)), 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
	guard := b.call(ctx, "daemon", map[string]any{})["daemon"].(map[string]any)["ingress_guard"].(map[string]any)
	require.Equal(t, "on", guard["state"], "the daemon view: %v", guard)
	require.EqualValues(t, DaemonPort, guard["port"])
	require.NoError(t, dial(DaemonPort), "the host reaches sandbox B's daemon on its network")
	require.Error(t, dial(8080), "the host reached a server in a session of sandbox B on B's network")

	// docker restart: a new network namespace, the guard written again
	// before the sessions come back.
	require.NoError(t, b.cli.ContainerRestart(ctx, workflows.ContainerName(b.spec.SandboxID), container.StopOptions{}))
	b.info, err = b.acts.ResolveDaemon(ctx, b.spec.SandboxID)
	require.NoError(t, err)
	readyCtx, cancelReady := context.WithTimeout(ctx, 60*time.Second)
	defer cancelReady()
	require.NoError(t, b.acts.WaitReady(readyCtx, b.spec.SandboxID, b.info.Daemon))
	require.Equal(t, "on", b.call(ctx, "daemon", map[string]any{})["daemon"].(map[string]any)["ingress_guard"].(map[string]any)["state"])
	c, err = b.cli.ContainerInspect(ctx, workflows.ContainerName(b.spec.SandboxID))
	require.NoError(t, err)
	ipB = c.NetworkSettings.Networks[networkName(b.spec.SandboxID)].IPAddress // Docker may give it another
	run = b.call(ctx, "exec_command", map[string]any{"workspace_session_id": server, "yield_time_ms": 300, "cmd": "busybox httpd -f -p 8080 -h www"})
	require.Equal(t, "running", run["status"], "%v", run)
	require.Eventually(t, func() bool { return b.get(ctx, server, ipB, 8080) == "B" }, 10*time.Second, 200*time.Millisecond,
		"after a restart sandbox B reaches its own server on %s", ipB)
	require.NoError(t, dial(DaemonPort), "after a restart the host reaches sandbox B's daemon")
	require.Error(t, dial(8080), "after a restart the host reached a server in a session of sandbox B")

	shared := a.call(ctx, "create_workspace_session", map[string]any{})["workspace_session_id"].(string)
	isolated := a.call(ctx, "create_workspace_session", map[string]any{"network_profile": "isolated"})["workspace_session_id"].(string)
	require.Empty(t, a.get(ctx, shared, ipB, 8080), "a shared session of sandbox A reached sandbox B")
	require.Empty(t, a.get(ctx, isolated, ipB, 8080), "an isolated session of sandbox A reached sandbox B")

	// Docker's gap, held open: the host forwards between the two bridges
	// before Docker's rules see the packets. A's sessions now reach B's
	// daemon port (so the gap is open), and still not its server.
	openGap(t, ctx, a, b)
	for _, ws := range []string{shared, isolated} {
		require.Eventually(t, func() bool { return a.get(ctx, ws, ipB, DaemonPort) != "" }, 10*time.Second, 200*time.Millisecond,
			"with the gap open, session %s of sandbox A reaches sandbox B's daemon port", ws)
		require.Empty(t, a.get(ctx, ws, ipB, 8080), "with Docker's rules bypassed, session %s of sandbox A reached sandbox B's server", ws)
	}
}

// openGap inserts, until the test ends, host rules that forward between the
// bridges of sandboxes a and b ahead of Docker's own: what Docker's FORWARD
// chain lets through for a moment each time it creates a network. They go
// in DOCKER-USER, the chain Docker keeps first and never rewrites: in
// FORWARD itself, a network created meanwhile (by a test running beside
// this one) would put Docker's jumps above them again and close the gap.
func openGap(t *testing.T, ctx context.Context, a, b *liveSandbox) {
	t.Helper()
	bridge := func(sb *liveSandbox) string {
		n, err := sb.cli.NetworkInspect(ctx, networkName(sb.spec.SandboxID), network.InspectOptions{})
		require.NoError(t, err)
		if name := n.Options["com.docker.network.bridge.name"]; name != "" {
			return name
		}
		return "br-" + n.ID[:12]
	}
	ba, bb := bridge(a), bridge(b)
	for _, dir := range [][2]string{{ba, bb}, {bb, ba}} {
		rule := []string{"DOCKER-USER", "-i", dir[0], "-o", dir[1], "-j", "ACCEPT"}
		out, err := exec.Command("iptables", append([]string{"-I"}, rule...)...).CombinedOutput()
		require.NoError(t, err, "iptables: %s", out)
		t.Cleanup(func() {
			if out, err := exec.Command("iptables", append([]string{"-D"}, rule...)...).CombinedOutput(); err != nil {
				t.Errorf("remove the gap's rule %v: %v: %s", rule, err, out)
			}
		})
	}
}
