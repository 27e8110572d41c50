package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// swapLoop is a session's background process that keeps swapping a
// directory of its workspace for a symlink to the daemon's secret dir and
// to another session's upper dir, and a file for a symlink to the daemon
// token, so that a capture, diff or publish that reads by path follows one
// of them at some point.
const swapLoop = `rm -rf d d.real top.txt top.real; mkdir -p d; echo public > d/f.txt; echo top > top.txt
nohup sh -c 'while :; do
  mv d d.real; ln -s /eos/secret d; mv top.txt top.real; ln -s /eos/secret/daemon.token top.txt
  rm d; ln -s %s d; rm d; mv d.real d; rm top.txt; mv top.real top.txt
done' >/dev/null 2>&1 &
echo started`

// TestHostileSessionCannotReachDaemonFiles: a session's processes race the
// daemon's captures with symlink swaps; nothing of the daemon token or of
// another session's unpublished work reaches a diff, a dry run, a refresh
// or a published layer, and no error names the state volume. File ops
// refuse paths through symlinks, file_search never lists through one, a
// session's /etc symlink never makes session start write outside it, and
// io_uring (with mount, unshare, bpf, keyctl) is refused inside commands.
func TestHostileSessionCannotReachDaemonFiles(t *testing.T) {
	sb := startSandbox(t, "eos-test-debian:1", baseTree())
	t.Logf("sandbox %s", sb.name)
	victim := sb.session(nil)
	const victimSecret = "VICTIM-unpublished-7d1e0c"
	sb.exec(victim, "echo "+victimSecret+" > v.txt")
	victimUpper := "/eos/sessions/" + victim + "/upper-0"
	secrets := []string{sb.token, victimSecret}

	noSecret := func(what string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		for _, s := range secrets {
			require.NotContains(t, string(b), s, "%s leaked a secret", what)
		}
	}
	noStatePath := func(what string, e map[string]any) {
		t.Helper()
		b, _ := json.Marshal(e)
		require.NotContains(t, string(b), "/eos", "%s error names the state volume: %s", what, b)
	}
	// call runs op and checks whatever comes back, success or error.
	call := func(op string, args map[string]any) (map[string]any, bool) {
		t.Helper()
		status, out := sb.call(op, args)
		noSecret(op, out)
		if e, ok := out["error"].(map[string]any); ok {
			noStatePath(op, e)
			require.NotEqual(t, "internal_error", e["kind"], "%s: %v", op, e)
			return e, false
		}
		require.Equal(t, 200, status, "%s: %v", op, out)
		return out, true
	}

	t.Run("swap race", func(t *testing.T) {
		hostile := sb.session(nil)
		var diffs, checks, refreshes, publishes int
		for round := 0; round < 4; round++ {
			out := sb.exec(hostile, fmt.Sprintf(swapLoop, victimUpper))
			require.Contains(t, out["output"], "started")
			for i := 0; i < 15; i++ {
				if _, ok := call("diff_workspace_session", map[string]any{"workspace_session_id": hostile}); ok {
					diffs++
				}
				if _, ok := call("check_publish", map[string]any{"workspace_session_id": hostile}); ok {
					checks++
				}
			}
			if _, ok := call("refresh_workspace_session", map[string]any{"workspace_session_id": hostile}); ok {
				refreshes++
			}
			// A refresh that moved the session restarted it: race again.
			sb.exec(hostile, fmt.Sprintf(swapLoop, victimUpper))
			for i := 0; i < 5; i++ {
				call("diff_workspace_session", map[string]any{"workspace_session_id": hostile})
			}
			// Publishing with keep restarts the session (the loop with it).
			if _, ok := call("publish_workspace_session", map[string]any{"workspace_session_id": hostile, "keep": true}); ok {
				publishes++
			}
			// Someone else publishes, so the next refresh has work to do.
			sb.ok("file_write", map[string]any{"path": fmt.Sprintf("other-%d.txt", round), "content": "x"})
		}
		t.Logf("diffs %d, checks %d, refreshes %d, publishes %d", diffs, checks, refreshes, publishes)
		require.Positive(t, diffs)
		require.Positive(t, checks)
		require.Positive(t, publishes)

		// No byte of either secret anywhere in the store: layers, manifests,
		// records.
		for _, s := range secrets {
			out, err := dockerOutput("exec", sb.name, "grep", "-rl", "--", s, "/eos/layerstack")
			require.Error(t, err, "grep found %q in the store: %s", s, out)
			require.Empty(t, strings.TrimSpace(out))
		}
		// Nor in what a sessionless reader sees.
		res := sb.ok("file_search", map[string]any{"glob": "*", "query": "."})
		noSecret("file_search of the head", res)
	})

	t.Run("file ops never cross a symlink", func(t *testing.T) {
		ws := sb.session(nil)
		sb.exec(ws, "ln -s / rootlink; mkdir -p sub; echo inside > sub/a.txt; ln -s sub sublink; ln -s /etc etclink")
		e := sb.fail("file_write", map[string]any{"path": "rootlink/etc/passwd", "content": "pwned\n", "workspace_session_id": ws}, "invalid_request")
		require.Contains(t, e["message"], "symlink")
		noStatePath("file_write", e)
		sb.fail("file_read", map[string]any{"path": "etc/passwd", "workspace_session_id": ws}, "not_found")
		out := sb.exec(ws, "grep -c pwned /etc/passwd; ls /workspace/etc 2>&1")
		require.Contains(t, out["output"], "0\n", "the session's /etc/passwd is untouched")
		require.Contains(t, out["output"], "No such file", "nothing was re-rooted into the workspace")
		sb.fail("file_read", map[string]any{"path": "sublink/a.txt", "workspace_session_id": ws}, "invalid_request")
		sb.fail("file_list", map[string]any{"path": "etclink", "workspace_session_id": ws}, "invalid_request")

		res := sb.ok("file_search", map[string]any{"glob": "*", "workspace_session_id": ws})
		var paths []string
		for _, m := range res["matches"].([]any) {
			paths = append(paths, m.(map[string]any)["path"].(string))
		}
		require.Contains(t, paths, "sub/a.txt")
		for _, p := range paths {
			require.False(t, strings.HasPrefix(p, "sublink/") || strings.HasPrefix(p, "etclink/") || strings.HasPrefix(p, "rootlink/"),
				"file_search listed %s through a symlink", p)
		}
		e = sb.fail("file_search", map[string]any{"path": "etclink", "glob": "*", "workspace_session_id": ws}, "invalid_request")
		noStatePath("file_search", e)
	})

	t.Run("a planted /etc symlink", func(t *testing.T) {
		docker(t, "exec", sb.name, "mkdir", "-p", "/var/tmp/etc-target")
		ws := sb.session(nil)
		// A process in the workspace holds it, so publishing with keep
		// restarts the session (an idle one would move in place): its /etc
		// is written again.
		out := sb.exec(ws, "rm -rf /etc && ln -s /var/tmp/etc-target /etc && echo w > w.txt && echo planted")
		require.Contains(t, out["output"], "planted")
		sb.daemonize(ws, "/workspace", "sleep 4300")
		_, _ = call("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true})
		require.NotContains(t, sb.exec(ws, "ps -o args")["output"], "sleep 4300", "the session was restarted")
		require.Empty(t, docker(t, "exec", sb.name, "ls", "-A", "/var/tmp/etc-target"), "session start wrote through the session's /etc symlink")
	})

	t.Run("syscalls refused in commands", func(t *testing.T) {
		ws := sb.session(nil)
		probe := `python3 - <<'EOF'
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(120)
for name, nr, args in [
    ("io_uring_setup", 425, (1, buf)),
    ("io_uring_enter", 426, (0, 0, 0, 0, None, 0)),
    ("io_uring_register", 427, (0, 0, None, 0)),
    ("unshare", 272, (0x10000000,)),
    ("mount", 165, (b"none", b"/mnt", b"tmpfs", 0, None)),
    ("bpf", 321, (0, None, 0)),
    ("keyctl", 250, (0, -3, 0)),
]:
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno())
EOF`
		out := sb.exec(ws, probe)
		got := strings.Split(strings.TrimSpace(out["output"].(string)), "\n")
		for _, name := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "mount", "bpf", "keyctl"} {
			require.Contains(t, got, name+" -1 1", "%s must fail with EPERM", name)
		}
	})
}

// dockerOutput runs docker and returns its output and error, for commands
// whose failure is the expected outcome.
func dockerOutput(args ...string) (string, error) {
	out, err := exec.Command("docker", args...).CombinedOutput()
	return string(out), err
}
