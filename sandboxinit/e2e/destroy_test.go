package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// TestDestroyAnswersWhenTheSessionIsGone: destroy_workspace_session answers
// once the session is gone for everyone — none of its processes runs, its
// lease is released, no list shows it, its id is not_found — and the rest of
// its teardown (cgroup, root overlay, session dir) follows in the
// background. The daemon killed in that background part is in
// cmd/sandbox-gateway's TestSessionFork (failpoint destroy-tail).
func TestDestroyAnswersWhenTheSessionIsGone(t *testing.T) {
	// No warm sessions: a warm build holds a lease while it runs, which
	// would move the lease count this test reads.
	sb := startSandboxWith(t, testenv.Images[0], map[string]string{"f.txt": "base\n"}, nil, []string{"--warm-sessions", "0"})
	leases := func() float64 {
		return sb.ok("daemon", nil)["daemon"].(map[string]any)["ownership"].(map[string]any)["leases"].(float64)
	}
	for _, force := range []bool{false, true} {
		ws := sb.session(nil)
		sb.exec(ws, "echo x > x.txt")
		marker := "sleep 4242"
		if force { // a command still running, and one in the background
			r := sb.ok("exec_command", map[string]any{"workspace_session_id": ws, "cmd": "sleep 4242 & sleep 4243", "yield_time_ms": 200})
			require.Equal(t, "running", r["status"], "%v", r)
			require.Eventually(t, func() bool { return processesWith(t, sb, marker) != "" }, 10*time.Second, 20*time.Millisecond, "the session's command runs")
		}
		held := leases()
		out := sb.ok("destroy_workspace_session", map[string]any{"workspace_session_id": ws, "force": force})
		require.Equal(t, true, out["destroyed"], "%v", out)
		require.Empty(t, processesWith(t, sb, marker), "force=%v: a process of the destroyed session still runs", force)
		require.Equal(t, held-1, leases(), "force=%v: the session's lease is released when destroy answers", force)
		for _, s := range sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any) {
			require.NotEqual(t, ws, s.(map[string]any)["workspace_session_id"])
		}
		sb.fail("file_read", map[string]any{"workspace_session_id": ws, "path": "f.txt"}, "not_found")
		sb.fail("destroy_workspace_session", map[string]any{"workspace_session_id": ws}, "not_found")
		require.Eventually(t, func() bool {
			return !strings.Contains(docker(t, "exec", sb.name, "ls", "/eos/sessions"), ws) &&
				!strings.Contains(docker(t, "exec", sb.name, "sh", "-c", "cat /proc/self/mountinfo"), ws)
		}, 10*time.Second, 20*time.Millisecond, "force=%v: the session's dir and mounts go", force)
	}
}

// TestDestroyKilledOnceRecorded: the daemon killed in a destroy once the
// session's record says destroyed, with the session's kill running beside
// that write (failpoint destroy-recorded: no answer sent, the lease still
// held), comes back with nothing of the session left: none of its processes
// runs, no list shows it, its lease is released, its dir, mounts and cgroup
// go; the destroy sent again answers not_found. (The kill ends after the
// write here, measured; the other order, a killed session whose record does
// not say destroyed, is what a container restart leaves of every session:
// TestSessionsSurviveRestarts starts them again on their work, and a
// destroy sent again removes such a one like any other.)
func TestDestroyKilledOnceRecorded(t *testing.T) {
	sb := startSandboxWith(t, testenv.Images[0], map[string]string{"f.txt": "base\n"}, nil, []string{"--warm-sessions", "0"})
	keep := sb.session(nil) // a session the destroy must not touch
	ws := sb.session(nil)
	r := sb.ok("exec_command", map[string]any{"workspace_session_id": ws, "cmd": "sleep 4343", "yield_time_ms": 200})
	require.Equal(t, "running", r["status"], "%v", r)
	require.Eventually(t, func() bool { return processesWith(t, sb, "sleep 4343") != "" }, 10*time.Second, 20*time.Millisecond, "the session's command runs")
	sb.arm("destroy-recorded")
	sb.dies("destroy_workspace_session", map[string]any{"workspace_session_id": ws, "force": true})

	require.Eventually(t, func() bool { return processesWith(t, sb, "sleep 4343") == "" }, 10*time.Second, 50*time.Millisecond,
		"a process of the destroyed session runs after the restart")
	onlySessionAndPool(t, sb, keep, 0)
	sb.fail("destroy_workspace_session", map[string]any{"workspace_session_id": ws}, "not_found")
	require.Equal(t, "base\n", sb.read(keep, "f.txt"), "the other session works")
}

// processesWith lists the command lines of the sandbox's processes (its
// sessions' included) that hold marker, one a line; "" when none does.
func processesWith(t *testing.T, sb *sandbox, marker string) string {
	t.Helper()
	return docker(t, "exec", sb.name, "sh", "-c",
		`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -F "`+marker+`" | grep -v grep || true`)
}
