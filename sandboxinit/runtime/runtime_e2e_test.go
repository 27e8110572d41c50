package runtime_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sandboxCaps is the capability set the product creates sandboxes with.
var sandboxCaps = []string{
	"SYS_ADMIN", "DAC_OVERRIDE", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "NET_ADMIN",
	"CHOWN", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP",
}

// wantChecks are the probe's checks that must all be present and ok.
var wantChecks = []string{
	"new", "start_a", "start_b", "start_c",
	"exec_latency_libcontainer", "exec_latency_via_init", "parallel_exec",
	"etc_write_private", "etc_write_not_in_sandbox", "hostname", "workspace_anchor", "workspace_bind", "workspace_follows", "freeze",
	"caps", "caps_via_init", "pid_namespace",
	"seccomp_filter", "seccomp_filter_via_init", "seccomp_syscalls", "seccomp_syscalls_via_init",
	"userns_denied", "userns_denied_via_init", "unshare_denied", "unshare_denied_via_init",
	"mount_denied", "mount_denied_via_init", "normal_work", "normal_work_via_init",
	"hidden_state_dir", "masked_paths",
	"cgroup_limits_written", "pids_limit_enforced", "memory_limit_enforced",
	"isolated_has_ip", "isolated_interfaces", "same_port_three_sessions",
	"isolated_reaches_sandbox", "isolated_cannot_reach_isolated", "sandbox_cannot_reach_isolated",
	"tty", "signal_group", "signal_group_via_init", "exit_code", "exit_code_via_init",
	"context_kills", "context_kills_via_init", "stdin_pipe", "stdin_pipe_via_init", "pids",
	"reexec", "new_after_restart", "sessions_listed",
	"load_a", "load_b", "exec_after_load_a", "exec_after_load_b", "fast_exec_after_load_a",
	"load_gone_c", "load_unknown_gone", "reap_unknown", "sessinit_sigterm", "reap_a", "destroy_b", "reap_half_destroyed", "sessions_empty", "done",
}

// wantImageChecks are further checks per image: the tools the probe
// exercises where the image has them.
var wantImageChecks = map[string][]string{
	"eos-test-debian:1": {"git_works", "git_works_via_init", "python_works", "python_works_via_init", "apt_works", "apt_works_via_init"},
}

// TestSessionsInDocker runs cmd/sessionprobe as PID 1 of a sandbox container
// created the way the product creates it, in each test image, and asserts
// every check it prints.
func TestSessionsInDocker(t *testing.T) {
	requireDocker(t)
	bin := buildProbe(t)
	seccomp, err := filepath.Abs("seccomp.json")
	require.NoError(t, err)

	for _, image := range []string{"eos-test-busybox:1", "eos-test-debian:1"} {
		t.Run(image, func(t *testing.T) {
			args := []string{"--security-opt", "seccomp=" + seccomp, "--sysctl", "net.ipv4.ip_forward=1"}
			for _, c := range sandboxCaps {
				args = append(args, "--cap-add", c) // Docker 20.10 rejects comma lists
			}
			checks, stderr := runProbe(t, image, bin, args)
			for _, name := range append(wantChecks, wantImageChecks[image]...) {
				c, ok := checks[name]
				require.True(t, ok, "check %q missing from the probe's output; stderr:\n%s", name, tail(stderr))
				require.Equal(t, true, c["ok"], "check %q failed: %v", name, c)
			}
			for name, c := range checks {
				require.Equal(t, true, c["ok"], "check %q failed: %v", name, c)
			}
			for _, name := range []string{"exec_latency_libcontainer", "exec_latency_via_init"} {
				c := checks[name]
				t.Logf("%s %s: p50 %.2f ms, p95 %.2f ms over %v runs", image, name, c["p50_ms"], c["p95_ms"], c["runs"])
			}
			t.Logf("%s start: a %.1f ms, b (isolated) %.1f ms; unshare -U in a session: %v", image,
				checks["start_a"]["ms"], checks["start_b"]["ms"], checks["userns_denied"]["out"])
		})
	}

	// Without SYS_ADMIN the runtime must refuse with a message naming it.
	t.Run("preflight names what is missing", func(t *testing.T) {
		checks, stderr := runProbe(t, "eos-test-busybox:1", bin, []string{"--cap-add", "SETUID"})
		c, ok := checks["new"]
		require.True(t, ok, "no 'new' check; stderr:\n%s", tail(stderr))
		require.Equal(t, false, c["ok"])
		require.Contains(t, c["error"], "missing capabilities SYS_ADMIN")
		require.Contains(t, c["error"], "DAC_OVERRIDE")
	})
	t.Run("preflight names a blocking seccomp profile", func(t *testing.T) {
		var args []string
		for _, c := range sandboxCaps {
			args = append(args, "--cap-add", c)
		}
		checks, stderr := runProbe(t, "eos-test-busybox:1", bin, args) // Docker's default profile
		c, ok := checks["new"]
		require.True(t, ok, "no 'new' check; stderr:\n%s", tail(stderr))
		require.Equal(t, false, c["ok"])
		require.Contains(t, c["error"], "seccomp blocks pivot_root")
	})
}

func requireDocker(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatalf("docker CLI not found: this test needs a Docker Engine (run scripts/ensure-docker.sh): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		t.Fatalf("Docker Engine not reachable (run scripts/ensure-docker.sh): %v: %s", err, out)
	}
	for _, img := range []string{"eos-test-busybox:1", "eos-test-debian:1"} {
		if out, err := exec.CommandContext(ctx, "docker", "image", "inspect", img).CombinedOutput(); err != nil {
			t.Fatalf("image %s missing (run scripts/build-test-images.sh): %v: %s", img, err, tail(string(out)))
		}
	}
}

// buildProbe builds cmd/sessionprobe the way the daemon is built: one
// statically linked binary, with libseccomp (libseccomp-dev, see
// scripts/ensure-build-deps.sh) for the sessions' seccomp filter.
func buildProbe(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sessionprobe")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "seccomp osusergo netgo",
		"-ldflags", "-linkmode external -extldflags -static", "-o", bin, "./cmd/sessionprobe")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "static build of cmd/sessionprobe failed (libseccomp-dev missing? run scripts/ensure-build-deps.sh):\n%s", out)
	return bin
}

// runProbe creates a sandbox container (dropping every capability, adding
// the given options), copies the probe in as its entrypoint, runs it with a
// fresh state volume at /eos and returns its checks by name and its stderr.
func runProbe(t *testing.T, image, bin string, opts []string) (map[string]map[string]any, string) {
	t.Helper()
	suffix := randomSuffix(t)
	name, volume := "eos-e2e-"+suffix, "eos-e2e-"+suffix
	docker := func(timeout time.Duration, args ...string) (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "docker", args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	t.Cleanup(func() {
		if _, stderr, err := docker(30*time.Second, "rm", "-f", "-v", name); err != nil {
			t.Errorf("remove container %s: %v: %s", name, err, stderr)
		}
		if _, stderr, err := docker(30*time.Second, "volume", "rm", "-f", volume); err != nil {
			t.Errorf("remove volume %s: %v: %s", volume, err, stderr)
		}
	})

	create := append([]string{"create", "--name", name, "--label", "eos.test=e2e", "--cap-drop", "ALL"}, opts...)
	create = append(create, "-v", volume+":/eos", "--entrypoint", "/sessionprobe", image)
	_, stderr, err := docker(30*time.Second, create...)
	require.NoError(t, err, "docker create: %s", stderr)
	_, stderr, err = docker(30*time.Second, "cp", bin, name+":/sessionprobe")
	require.NoError(t, err, "docker cp: %s", stderr)
	// A failing probe exits 1; the checks say why.
	stdout, stderr, _ := docker(90*time.Second, "start", "-a", name)

	checks := map[string]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var c map[string]any
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("probe printed a non-JSON line %q; stderr:\n%s", sc.Text(), tail(stderr))
		}
		name, _ := c["check"].(string)
		checks[name] = c
	}
	return checks, stderr
}

func randomSuffix(t *testing.T) string {
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 30 {
		lines = append([]string{fmt.Sprintf("... %d lines before", len(lines)-30)}, lines[len(lines)-30:]...)
	}
	return strings.Join(lines, "\n")
}
