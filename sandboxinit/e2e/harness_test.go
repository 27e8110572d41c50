package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// Images the tests run the daemon in (scripts/build-test-images.sh).
var images = testenv.Images

// sandboxCaps is the capability set the product grants a sandbox container.
var sandboxCaps = []string{
	"SYS_ADMIN", "DAC_OVERRIDE", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "NET_ADMIN",
	"CHOWN", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP",
}

const daemonPath = "/usr/local/lib/eos/sandbox-daemon"

// daemonBinary and requireDocker come from internal/testenv, shared with
// the lifecycle tests.
func daemonBinary(t testing.TB) string { return testenv.DaemonBinary(t) }

func requireDocker(t testing.TB) { testenv.RequireDocker(t) }

func docker(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "docker %s: %s", strings.Join(args, " "), stderr.String())
	return strings.TrimSpace(string(out))
}

// sandbox is one running sandbox container with the daemon as PID 1.
type sandbox struct {
	t       testing.TB
	name    string
	volume  string
	image   string
	token   string
	baseURL string
	client  *http.Client
}

// startSandbox creates and starts a sandbox from image with base as the
// workspace, and imports the base; createArgs go to docker create (e.g.
// --network).
func startSandbox(t testing.TB, image string, base map[string]string, createArgs ...string) *sandbox {
	t.Helper()
	return startSandboxWith(t, image, base, createArgs, nil)
}

// startSandboxWith is startSandbox with sandbox-daemon flags (daemonArgs).
func startSandboxWith(t testing.TB, image string, base map[string]string, createArgs, daemonArgs []string) *sandbox {
	t.Helper()
	requireDocker(t)
	bin := daemonBinary(t)
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	suffix := hex.EncodeToString(rb[:])
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	sb := &sandbox{t: t, name: "eos-e2e-" + suffix, volume: "eos-e2e-" + suffix, image: image,
		token: hex.EncodeToString(tok), client: &http.Client{Timeout: 5 * time.Minute}}
	seccomp, err := filepath.Abs(filepath.Join("..", "runtime", "seccomp.json"))
	require.NoError(t, err)
	args := []string{"create", "--name", sb.name, "--cap-drop", "ALL",
		"--security-opt", "seccomp=" + seccomp, "--sysctl", "net.ipv4.ip_forward=1",
		"--label", "eos.test=e2e", "-v", sb.volume + ":/eos", "-p", "127.0.0.1::7001",
		"--entrypoint", daemonPath}
	for _, c := range sandboxCaps {
		args = append(args, "--cap-add", c)
	}
	args = append(append(append(args, createArgs...), image), daemonArgs...)
	docker(t, "volume", "create", "--label", "eos.test=e2e", sb.volume)
	docker(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("docker", "logs", "--tail", "60", sb.name).CombinedOutput()
			t.Logf("daemon logs of %s:\n%s", sb.name, out)
		}
		_ = exec.Command("docker", "rm", "-f", "-v", sb.name).Run()
		_ = exec.Command("docker", "volume", "rm", "-f", sb.volume).Run()
	})

	// One tar into the created container: the binary, the token (0600) and
	// the workspace to import.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64) {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: mode}))
	}
	file := func(name string, mode int64, data []byte) {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data))}))
		_, err := tw.Write(data)
		require.NoError(t, err)
	}
	for _, d := range []string{"usr", "usr/local", "usr/local/lib", "usr/local/lib/eos", "eos", "eos/secret", "eos/import", "eos/import/src"} {
		dir(d, 0o755)
	}
	b, err := os.ReadFile(bin)
	require.NoError(t, err)
	file(strings.TrimPrefix(daemonPath, "/"), 0o755, b)
	// The small session init next to it, as the product ships it: every
	// session's PID 1 (the daemon binary itself runs sessions' inits only
	// where it is missing; sandboxinit/runtime's TestSessionsInDocker covers that).
	si, err := os.ReadFile(filepath.Join(filepath.Dir(bin), "sandbox-sessinit"))
	require.NoError(t, err)
	file(strings.TrimPrefix(filepath.Dir(daemonPath), "/")+"/sandbox-sessinit", 0o755, si)
	file("eos/secret/daemon.token", 0o600, []byte(sb.token))
	for p, content := range base {
		full := "eos/import/src/" + p
		parts := strings.Split(full, "/")
		for i := 4; i < len(parts); i++ {
			dir(strings.Join(parts[:i], "/"), 0o755)
		}
		mode := int64(0o644)
		if strings.HasSuffix(p, ".sh") {
			mode = 0o755
		}
		file(full, mode, []byte(content))
	}
	require.NoError(t, tw.Close())
	cmd := exec.Command("docker", "cp", "-", sb.name+":/")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "docker cp: %s", out)

	docker(t, "start", sb.name)
	sb.connect()
	res := sb.ok("init_base", map[string]any{"source_dir": "/eos/import/src", "remove_source": true})
	require.NotEmpty(t, res["base_id"])
	return sb
}

// connect finds the published port and waits for the daemon to answer.
func (sb *sandbox) connect() {
	t := sb.t
	port := docker(t, "port", sb.name, "7001/tcp")
	port = strings.Split(port, "\n")[0]
	sb.baseURL = "http://" + port
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodGet, sb.baseURL+"/health", nil)
		req.Header.Set("Authorization", "Bearer "+sb.token)
		resp, err := sb.client.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 100*time.Millisecond, "daemon in %s never became ready", sb.name)
}

// arm arms failpoints of the sandbox's layer store (its failpoint file:
// a kill failpoint's name, or "error:<name>"), each of which fires once.
func (sb *sandbox) arm(failpoints ...string) {
	sb.t.Helper()
	docker(sb.t, "exec", sb.name, "sh", "-c", "printf '%s\\n' "+strings.Join(failpoints, " ")+" > /eos/layerstack/.failpoints")
}

// restartDaemon kills the daemon (not PID 1, which starts it again) and
// waits until a new one answers.
func (sb *sandbox) restartDaemon() {
	t := sb.t
	t.Helper()
	h := sb.ok("health", map[string]any{})
	docker(t, "exec", sb.name, "sh", "-c", fmt.Sprintf("kill -9 %v", h["daemon_pid"])) // no kill binary in Debian's image
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodPost, sb.baseURL+"/rpc/health", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+sb.token)
		resp, err := sb.client.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out map[string]any
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&out) == nil &&
			out["daemon_pid"] != nil && out["daemon_pid"] != h["daemon_pid"]
	}, 60*time.Second, 100*time.Millisecond, "the daemon never came back")
}

// call runs an RPC and returns the status and decoded body.
func (sb *sandbox) call(op string, args any) (int, map[string]any) {
	sb.t.Helper()
	return sb.callWith(op, args, "Bearer "+sb.token)
}

func (sb *sandbox) callWith(op string, args any, auth string) (int, map[string]any) {
	sb.t.Helper()
	h := map[string]string{}
	if auth != "" {
		h["Authorization"] = auth
	}
	return sb.request(op, args, h)
}

// request posts args to /rpc/<op> with the given headers and decodes the
// JSON answer.
func (sb *sandbox) request(op string, args any, headers map[string]string) (int, map[string]any) {
	sb.t.Helper()
	body, err := json.Marshal(args)
	require.NoError(sb.t, err)
	req, err := http.NewRequest(http.MethodPost, sb.baseURL+"/rpc/"+op, bytes.NewReader(body))
	require.NoError(sb.t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := sb.client.Do(req)
	require.NoError(sb.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(sb.t, err)
	var out map[string]any
	require.NoError(sb.t, json.Unmarshal(raw, &out), "%s: %s", op, raw)
	return resp.StatusCode, out
}

// ok runs an RPC that must succeed.
func (sb *sandbox) ok(op string, args any) map[string]any {
	sb.t.Helper()
	status, out := sb.call(op, args)
	require.Equal(sb.t, http.StatusOK, status, "%s(%v) -> %v", op, args, out)
	return out
}

// fail runs an RPC that must fail with kind, and returns the error.
func (sb *sandbox) fail(op string, args any, kind string) map[string]any {
	sb.t.Helper()
	status, out := sb.call(op, args)
	require.NotEqual(sb.t, http.StatusOK, status, "%s(%v) should fail, got %v", op, args, out)
	e, _ := out["error"].(map[string]any)
	require.Equal(sb.t, kind, e["kind"], "%s(%v) -> %v", op, args, out)
	return e
}

// exec runs cmd (in session ws, "" for implicit) until it ends.
func (sb *sandbox) exec(ws, cmd string) map[string]any {
	sb.t.Helper()
	out := sb.ok("exec_command", map[string]any{"cmd": cmd, "workspace_session_id": ws, "yield_time_ms": 60000})
	require.NotEqual(sb.t, "running", out["status"], "%s still running: %v", cmd, out)
	return out
}

// daemonize starts cmd (a program and its arguments, no shell syntax) in
// session ws as a daemon (setsid, working directory dir) and returns once
// it runs. A command's exec returns when its shell exits, perhaps before
// the child the shell forked has exec'd cmd: a ps in that window misses it
// (during the exec its cmdline is empty).
func (sb *sandbox) daemonize(ws, dir, cmd string) {
	sb.t.Helper()
	out := sb.exec(ws, "cd "+dir+" && setsid "+cmd+" </dev/null >/dev/null 2>&1 & pid=$!; "+
		"for i in $(seq 1000); do [ \"$(tr '\\0' ' ' </proc/$pid/cmdline 2>/dev/null)\" = '"+cmd+" ' ] && exit 0; sleep 0.01; done; exit 1")
	require.Equal(sb.t, "ok", out["status"], "%s never started: %v", cmd, out)
}

// running reports whether a process of session ws has marker in its
// command line.
func (sb *sandbox) running(ws, marker string) bool {
	sb.t.Helper()
	out := sb.exec(ws, "ps -o args | grep -v grep | grep -c '"+marker+"' || true")["output"].(string)
	return strings.TrimSpace(out) != "0"
}

func (sb *sandbox) session(args map[string]any) string {
	sb.t.Helper()
	if args == nil {
		args = map[string]any{}
	}
	out := sb.ok("create_workspace_session", args)
	id, _ := out["workspace_session_id"].(string)
	require.NotEmpty(sb.t, id)
	return id
}

// sessionWith creates a session and runs cmd in it (its work to publish).
func (sb *sandbox) sessionWith(cmd string) string {
	sb.t.Helper()
	ws := sb.session(nil)
	sb.exec(ws, cmd)
	return ws
}

// read returns a file's whole text, final newline included (the tests
// compare exact contents; the seed's default drops it).
func (sb *sandbox) read(ws, path string) string {
	sb.t.Helper()
	out := sb.ok("file_read", map[string]any{"path": path, "workspace_session_id": ws, "keep_final_newline": true})
	return out["content"].(string)
}

func tail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}
