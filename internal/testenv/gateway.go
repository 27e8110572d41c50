package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Commands Binaries builds (every main a test may run as a process).
var Commands = []string{"sandbox-gateway", "sandbox-manager-cli", "sandbox-runtime-cli", "sandbox-observability-cli", "sandbox-mcp"}

var binsBuild built

// Binaries builds the product's commands once per test binary and returns
// their directory. The caller's TestMain should call CleanupBinaries.
func Binaries(t testing.TB) string {
	t.Helper()
	return binsBuild.get(t, "eos-bins-", func(dir string) error {
		args := []string{"-o", dir + string(filepath.Separator)}
		for _, c := range Commands {
			args = append(args, "./cmd/"+c)
		}
		return goBuild(nil, args...)
	})
}

// CleanupBinaries removes what Binaries built.
func CleanupBinaries() {
	if binsBuild.dir != "" {
		_ = os.RemoveAll(binsBuild.dir)
	}
}

// Gateway is a sandbox-gateway process on the embedded Temporal.
type Gateway struct {
	Addr     string // host:port of HTTP and JSON lines
	Token    string
	StateDir string
	Bins     string // directory of the built commands
	Home     string // HOME of the gateway (and of the CLIs a test runs)
	Stderr   *SyncBuffer
	Pid      int
	// Dir and HostQueue start it again in the same place (Options).
	Dir       string
	HostQueue string
	args      []string
	exited    chan struct{}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreePort returns a loopback address nothing listens on (yet).
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// StartGateway runs the sandbox-gateway binary with the embedded Temporal
// (UI off), a temp state dir and token file, the locally built daemon, and
// waits until it answers list_sandboxes over HTTP. It is stopped (SIGINT)
// when the test ends.
func StartGateway(t testing.TB) *Gateway {
	t.Helper()
	return StartGatewayWith(t, GatewayOptions{})
}

// GatewayOptions place a gateway process; a restarted gateway reuses the
// first one's (same state dir, home, token, host queue and address).
type GatewayOptions struct {
	Dir       string   // holds state/, home/ and gateway.token ("" = a new temp dir)
	Addr      string   // "" = a free port
	HostQueue string   // "" = a new one
	Reconcile bool     // run the start-up reconciler (off by default in tests)
	Args      []string // more sandbox-gateway flags (kept by Options)
	Env       []string // more environment, e.g. a worker failpoint (not kept by Options)
}

// Options are the options that start this gateway again as it was.
func (g *Gateway) Options() GatewayOptions {
	return GatewayOptions{Dir: g.Dir, Addr: g.Addr, HostQueue: g.HostQueue, Args: g.args}
}

// StartGatewayWith is StartGateway in a given place. A port it picked
// itself that another process took before the gateway bound it (FreePort
// closes its listener first) is replaced by a new one, at most 3 times. A
// restart on its first address (o.Addr) whose port was taken meanwhile
// (the kernel hands freed ports to outgoing connections too) tries it
// again for a few seconds, then takes a new one: clients find a gateway
// through its home's settings and the returned Gateway, not the port.
func StartGatewayWith(t testing.TB, o GatewayOptions) *Gateway {
	t.Helper()
	if o.Addr != "" {
		for attempt := 1; ; attempt++ {
			g, err := startGateway(t, o)
			if err == nil {
				return g
			}
			if !errors.Is(err, errPortTaken) {
				t.Fatal(err)
			}
			if attempt == 10 {
				t.Logf("port %s stayed taken; the gateway starts on another", o.Addr)
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	for attempt := 1; ; attempt++ {
		o.Addr = FreePort(t)
		g, err := startGateway(t, o)
		if err == nil {
			return g
		}
		if attempt == 3 || !errors.Is(err, errPortTaken) {
			t.Fatal(err)
		}
		t.Logf("port %s was taken before the gateway bound it; another", o.Addr)
	}
}

// errPortTaken: the gateway exited at start because its address was in use.
var errPortTaken = errors.New("address already in use")

func startGateway(t testing.TB, o GatewayOptions) (*Gateway, error) {
	t.Helper()
	RequireDocker(t)
	daemon := DaemonBinary(t)
	bins := Binaries(t)
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.HostQueue == "" {
		o.HostQueue = fmt.Sprintf("eos-host-test-%d", time.Now().UnixNano())
	}
	g := &Gateway{Addr: o.Addr, Dir: o.Dir, HostQueue: o.HostQueue, StateDir: filepath.Join(o.Dir, "state"), Bins: bins,
		Home: filepath.Join(o.Dir, "home"), Stderr: &SyncBuffer{}, args: o.Args}
	if err := os.MkdirAll(g.Home, 0o700); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(o.Dir, "gateway.token")
	args := []string{"--listen", g.Addr, "--token-file", tokenFile, "--state-dir", g.StateDir,
		"--temporal-embedded-address", "127.0.0.1:0", "--temporal-ui", "off",
		"--host-queue", o.HostQueue,
		"--daemon-binary", daemon,
		"--seccomp-profile", filepath.Join(RepoRoot(), "sandboxinit", "runtime", "seccomp.json"),
		fmt.Sprintf("--reconcile=%v", o.Reconcile), "--allow-root", TempRoot(t),
		// Standby sandboxes would add a container per image to every
		// test; the tests of them turn them on (a later flag wins).
		"--standby=false"}
	cmd := exec.Command(filepath.Join(bins, "sandbox-gateway"), append(args, o.Args...)...)
	cmd.Env = append(append(ownTemporal(os.Environ()), "HOME="+g.Home), o.Env...)
	cmd.Stderr = g.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g.Pid = cmd.Process.Pid
	exited := make(chan struct{})
	g.exited = exited
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b, err := os.ReadFile(tokenFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			g.Token = string(bytes.TrimSpace(b))
			if st, _, err := g.HTTPOp("list_sandboxes", nil); err == nil && st == http.StatusOK {
				return g, nil
			}
		}
		select {
		case <-exited:
			if strings.Contains(g.Stderr.String(), "bind: address already in use") {
				return nil, fmt.Errorf("gateway exited during start: %w:\n%s", errPortTaken, g.Stderr.String())
			}
			return nil, fmt.Errorf("gateway exited during start:\n%s", g.Stderr.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("gateway not ready after 2m:\n%s", g.Stderr.String())
		}
	}
}

// Kill SIGKILLs the gateway process (its embedded Temporal and workers
// with it) and waits until it is gone.
func (g *Gateway) Kill() {
	_ = syscall.Kill(g.Pid, syscall.SIGKILL)
	<-g.exited
}

// Exited is closed once the gateway process is gone.
func (g *Gateway) Exited() <-chan struct{} { return g.exited }

// Stop SIGINTs the gateway (a graceful shutdown) and waits until it is
// gone.
func (g *Gateway) Stop() {
	_ = syscall.Kill(g.Pid, syscall.SIGINT)
	<-g.exited
}

// Get sends a GET to the gateway with the bearer token ("" = none).
func (g *Gateway) Get(path, token string) (int, []byte, error) {
	return g.do(http.MethodGet, path, token, nil)
}

// do sends one request and reads the whole answer.
func (g *Gateway) do(method, path, token string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, "http://"+g.Addr+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := HTTPClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, bytes.TrimSpace(buf.Bytes()), err
}

// RSS is the gateway process's resident memory in bytes (VmRSS).
func (g *Gateway) RSS() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.Pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			var kb int64
			fmt.Sscan(f[1], &kb)
			return kb * 1024
		}
	}
	return -1
}

// HTTPClient is the client tests use against a gateway.
var HTTPClient = &http.Client{Timeout: 5 * time.Minute}

// HTTPOp posts body ({scope, args, request_id}) to /v1/ops/<op>.
func (g *Gateway) HTTPOp(op string, body map[string]any) (int, []byte, error) {
	if body == nil {
		body = map[string]any{}
	}
	b, _ := json.Marshal(body)
	return g.do(http.MethodPost, "/v1/ops/"+op, g.Token, b)
}

// RawLine sends one hand-written JSON line over a fresh TCP connection,
// half-closes, and reads the one answer line.
func RawLine(addr string, req map[string]any) ([]byte, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return nil, err
	}
	r := bufio.NewReaderSize(c, 1<<20)
	line, err := r.ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return nil, err
	}
	return bytes.TrimSpace(line), nil
}

// DockerObjects lists the ids of a sandbox's containers ("container"),
// volumes ("volume") or networks ("network") by label.
func DockerObjects(t testing.TB, kind, id string) []string {
	t.Helper()
	var args []string
	switch kind {
	case "container":
		args = []string{"ps", "-aq", "--filter", "label=eos.sandbox_id=" + id}
	case "network":
		args = []string{"network", "ls", "-q", "--filter", "label=eos.sandbox_id=" + id}
	default:
		args = []string{"volume", "ls", "-q", "--filter", "label=eos.sandbox_id=" + id}
	}
	out, err := exec.Command("docker", args...).Output()
	if err != nil {
		t.Errorf("docker %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// RemoveSandboxObjects force-removes whatever Docker objects a sandbox left:
// containers first, then its network (each sandbox has one) and volumes.
func RemoveSandboxObjects(t testing.TB, id string) {
	if ids := DockerObjects(t, "container", id); len(ids) > 0 {
		_ = exec.Command("docker", append([]string{"rm", "-f", "-v"}, ids...)...).Run()
	}
	if ids := DockerObjects(t, "network", id); len(ids) > 0 {
		_ = exec.Command("docker", append([]string{"network", "rm"}, ids...)...).Run()
	}
	if ids := DockerObjects(t, "volume", id); len(ids) > 0 {
		_ = exec.Command("docker", append([]string{"volume", "rm", "-f"}, ids...)...).Run()
	}
}

// ownTemporal is env without the TEMPORAL_* settings that would point a
// test's gateway at another Temporal (make test-cluster exports the
// cluster's to its tests): a test gateway runs its embedded one unless
// its Env says otherwise.
func ownTemporal(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "TEMPORAL_") {
			out = append(out, kv)
		}
	}
	return out
}
