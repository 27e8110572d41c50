package worker

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func startAuthDevServer(t *testing.T, ui string) (*DevServer, []byte) {
	t.Helper()
	secret := []byte(randHex(32))
	dev, err := StartDevServer(context.Background(), DevServerOptions{StateDir: t.TempDir(), Address: "127.0.0.1:0", UIAddress: ui,
		Secret: secret, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(dev.Stop)
	return dev, secret
}

// TestEmbeddedTemporalRefusesStrangers: a client in another process
// without the deployment secret's token gets Unauthenticated from the
// embedded frontend, over gRPC and its HTTP API; with the token it works.
// The stranger runs as a child process: another program on the machine.
func TestEmbeddedTemporalRefusesStrangers(t *testing.T) {
	dev, secret := startAuthDevServer(t, "")
	cmd := exec.Command(os.Args[0], "-test.run=^TestStrangerChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), strangerEnv+"="+strings.Join([]string{dev.Address, dev.HTTPAddress, dev.Namespace, FrontendToken(secret)}, ","))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "stranger checks done", "%s", out)

	// The product's client, in this process too.
	c, err := client.Dial(client.Options{HostPort: dev.Address, Logger: quietLogger{}, HeadersProvider: Headers(secret)})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Namespace: dev.Namespace})
	require.NoError(t, err)

	// No UI by default: nothing this process listens on serves it.
	require.Empty(t, dev.UIAddress)
	addrs := listeningAddrs(t)
	for _, addr := range addrs {
		require.False(t, servesUI(addr), "%s serves the Temporal UI, which is off by default", addr)
	}

	// The internal services (history, matching, the internal frontend)
	// answer only their own mutual-TLS peers: neither a plain gRPC client
	// nor a TLS client without the in-memory CA's certificate gets one.
	internal := 0
	for _, addr := range addrs {
		if addr == dev.Address || addr == dev.HTTPAddress {
			continue
		}
		internal++
		for _, creds := range []credentials.TransportCredentials{insecure.NewCredentials(),
			credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})} {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			conn.Close()
			require.Error(t, err, "internal service at %s answered a stranger", addr)
		}
		// The internal frontend's HTTP API runs the token check too.
		if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/api/v1/namespaces/" + dev.Namespace + "/workflows"); err == nil {
			resp.Body.Close()
			require.NotEqual(t, http.StatusOK, resp.StatusCode, "%s lists workflows for a stranger", addr)
		}
	}
	require.GreaterOrEqual(t, internal, 3, "history, matching and the internal frontend listen: %v", addrs)
}

const strangerEnv = "EOS_TEST_TEMPORAL_STRANGER"

// TestStrangerChild is the other process of
// TestEmbeddedTemporalRefusesStrangers (it does nothing on its own).
func TestStrangerChild(t *testing.T) {
	env := os.Getenv(strangerEnv)
	if env == "" {
		return
	}
	f := strings.Split(env, ",")
	addr, httpAddr, ns, token := f[0], f[1], f[2], f[3]

	// A plain SDK client: its first call (GetSystemInfo) is refused.
	_, err := client.Dial(client.Options{HostPort: addr, Logger: quietLogger{}})
	require.Error(t, err)
	require.Contains(t, err.Error(), "authorization token missing or wrong")

	// Raw gRPC calls, without and with a wrong token, then the right one.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ws := workflowservice.NewWorkflowServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, md := range []metadata.MD{nil, metadata.Pairs("authorization", "Bearer "+FrontendToken([]byte("another secret")))} {
		_, err = ws.StartWorkflowExecution(metadata.NewOutgoingContext(ctx, md), &workflowservice.StartWorkflowExecutionRequest{Namespace: ns, WorkflowId: "x"})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
		_, err = ws.ListWorkflowExecutions(metadata.NewOutgoingContext(ctx, md), &workflowservice.ListWorkflowExecutionsRequest{Namespace: ns})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	}
	_, err = ws.ListWorkflowExecutions(metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer "+token)),
		&workflowservice.ListWorkflowExecutionsRequest{Namespace: ns})
	require.NoError(t, err, "the token opens the door")

	// The frontend's HTTP API runs the same check.
	get := func(auth string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/api/v1/namespaces/"+ns+"/workflows", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, get(""))
	require.Equal(t, http.StatusOK, get("Bearer "+token))
	// Nexus's HTTP routes, which Temporal does not put behind the token,
	// are off: no task is dispatched, no callback parsed.
	for _, path := range []string{"/namespaces/" + ns + "/task-queues/x/nexus-services/s/op", "/nexus/endpoints/e/services/s/op",
		"/namespaces/" + ns + "/nexus/callback"} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+path, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Nexus-Operation-State", "succeeded") // a well-formed completion: it reaches the handler
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Contains(t, []int{http.StatusNotFound, http.StatusUnauthorized}, resp.StatusCode, "%s: %s", path, body)
	}

	// The SDK client with the token.
	c, err := client.Dial(client.Options{HostPort: addr, Logger: quietLogger{}, HeadersProvider: tokenHeaders(token)})
	require.NoError(t, err)
	c.Close()
	t.Log("stranger checks done")
}

// TestTemporalUIBehindLogin: with --temporal-ui the UI answers only its
// own Host and only after the login; then the UI's API calls reach the
// frontend with the token.
func TestTemporalUIBehindLogin(t *testing.T) {
	dev, secret := startAuthDevServer(t, "127.0.0.1:0")
	require.NotEmpty(t, dev.UIAddress)
	noRedirect := &http.Client{Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(host, path, cookie string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://"+dev.UIAddress+path, nil)
		if host != "" {
			req.Host = host
		}
		if cookie != "" {
			req.Header.Set("Cookie", uiCookie+"="+cookie)
		}
		req.Header.Set("Origin", "http://evil.example")
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))
		return resp
	}
	require.Equal(t, http.StatusMisdirectedRequest, do("evil.example", "/?login="+UIToken(secret), "").StatusCode)
	require.Equal(t, http.StatusUnauthorized, do("", "/", "").StatusCode)
	require.Equal(t, http.StatusUnauthorized, do("", "/?login=wrong", "").StatusCode)
	resp := do("", "/?login="+UIToken(secret), "")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.NotEmpty(t, resp.Cookies())
	require.True(t, resp.Cookies()[0].HttpOnly)
	require.Eventually(t, func() bool {
		return do("", "/api/v1/namespaces/"+dev.Namespace+"/workflows", UIToken(secret)).StatusCode == http.StatusOK
	}, 20*time.Second, 100*time.Millisecond, "the UI's API reaches the frontend with the token")
	require.Equal(t, http.StatusMisdirectedRequest, do("evil.example:"+strings.Split(dev.UIAddress, ":")[1], "/", UIToken(secret)).StatusCode)

	// The UI server behind the front holds no credential: reached
	// directly, its API gets nothing from the frontend.
	inner := 0
	for _, addr := range listeningAddrs(t) {
		if addr == dev.UIAddress || !servesUI(addr) {
			continue
		}
		inner++
		resp, err := noRedirect.Get("http://" + addr + "/api/v1/namespaces/" + dev.Namespace + "/workflows")
		require.NoError(t, err)
		resp.Body.Close()
		require.NotEqual(t, http.StatusOK, resp.StatusCode, "the inner UI server at %s lists workflows for a stranger", addr)
	}
	require.Equal(t, 1, inner, "one inner UI server")
}

// listeningAddrs are the loopback TCP addresses this process listens on.
func listeningAddrs(t *testing.T) []string {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	f, err := os.Open("/proc/self/net/tcp")
	require.NoError(t, err)
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 10 || fl[3] != "0A" || !inodes[fl[9]] { // 0A = LISTEN
			continue
		}
		hp := strings.Split(fl[1], ":")
		port, _ := strconv.ParseUint(hp[1], 16, 16)
		out = append(out, fmt.Sprintf("127.0.0.1:%d", port))
	}
	require.NotEmpty(t, out)
	return out
}

// servesUI reports whether addr answers GET / with the UI's HTML page.
func servesUI(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr)
	b, _ := io.ReadAll(io.LimitReader(c, 1<<20))
	return strings.Contains(strings.ToLower(string(b)), "<html")
}
