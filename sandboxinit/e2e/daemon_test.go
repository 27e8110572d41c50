package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

func numbered(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

func baseTree() map[string]string {
	return map[string]string{"f.txt": numbered(10), "run.sh": "#!/bin/sh\necho run\n", ".gitignore": "*.log\n", "src/main.go": "package main\n"}
}

// TestDaemonInBothImages: the same binary serves the whole session and
// publish flow in a busybox and a Debian container.
func TestDaemonInBothImages(t *testing.T) {
	for _, image := range images {
		t.Run(image, func(t *testing.T) {
			sb := startSandbox(t, image, baseTree())

			// Two sessions edit disjoint lines of one file: both land, merged.
			a, b, c := sb.session(nil), sb.session(map[string]any{"agent": "agent-b"}), sb.session(nil)
			sb.exec(a, "sed -i 's/^line 2$/LINE TWO/' f.txt")
			sb.exec(b, "sed -i 's/^line 9$/LINE NINE/' f.txt")
			sb.exec(c, "sed -i 's/^line 2$/line two, differently/' f.txt")
			sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": a})
			pub := sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": b})
			require.Equal(t, true, pub["destroyed"])
			got := sb.read("", "f.txt")
			require.Contains(t, got, "LINE TWO\n")
			require.Contains(t, got, "LINE NINE\n")

			// The third overlaps: a per-path conflict report, nothing changes.
			e := sb.fail("publish_workspace_session", map[string]any{"workspace_session_id": c}, "operation_failed")
			det := e["details"].(map[string]any)
			require.Equal(t, true, det["session_retained"])
			rej := det["publish_rejection"].(map[string]any)
			require.Equal(t, "f.txt", rej["path"])
			require.Equal(t, "source_conflict", rej["reason"])
			conflicts := det["conflicts"].([]any)
			require.Equal(t, "content", conflicts[0].(map[string]any)["kind"])
			require.Equal(t, got, sb.read("", "f.txt"))

			// The conflicted session can see the conflict, refresh is refused
			// for the same reason, and after fixing its change it publishes.
			sb.exec(c, "cp f.txt /tmp/mine && sed -i 's/^line two, differently$/line 2/' f.txt && sed -i 's/^line 5$/line five/' f.txt")
			sb.ok("refresh_workspace_session", map[string]any{"workspace_session_id": c})
			require.Contains(t, sb.read(c, "f.txt"), "LINE NINE\n", "refresh brought the others' work in")
			sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": c})
			require.Contains(t, sb.read("", "f.txt"), "line five\n")

			// A bare exec runs in an implicit session that publishes itself.
			out := sb.exec("", "echo implicit > implicit.txt && echo done")
			require.Equal(t, "ok", out["status"])
			require.NotContains(t, out, "publish_rejected", "a clean implicit publish carries no publish_rejected key")
			require.Equal(t, "implicit\n", sb.read("", "implicit.txt"))

			sessions := sb.ok("list_workspace_sessions", map[string]any{})["workspace_sessions"].([]any)
			require.Empty(t, sessions)
		})
	}
}

// TestSessionsAreIsolated: writes, package installs and processes of one
// session are invisible to another and to sessionless reads; commands
// cannot mount, unshare, load modules or see the daemon's state and token.
func TestSessionsAreIsolated(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	a, b := sb.session(nil), sb.session(nil)
	sb.exec(a, "echo secret > ws-a.txt; mkdir -p /opt/pkg && echo installed > /opt/pkg/a")
	sb.daemonize(a, "/", "sleep 37")
	out := sb.exec(b, "cat ws-a.txt /opt/pkg/a 2>&1; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '[s]leep 37' || true")
	require.Contains(t, out["output"], "No such file")
	require.True(t, strings.HasSuffix(strings.TrimSpace(out["output"].(string)), "0"), "b sees a's process: %v", out["output"])
	sb.fail("file_read", map[string]any{"path": "ws-a.txt"}, "not_found")
	require.Equal(t, "secret\n", sb.read(a, "ws-a.txt"))

	for _, tc := range []struct{ cmd, want string }{
		{"mount -t tmpfs x /mnt && echo MOUNTED", ""},
		{"unshare -m true && echo UNSHARED", ""},
		{"ls /eos 2>&1; cat /eos/secret/daemon.token 2>&1", ""},
		{"grep NoNewPrivs /proc/self/status", "NoNewPrivs:\t1"},
	} {
		out := sb.exec(a, tc.cmd)
		text := out["output"].(string)
		require.NotContains(t, text, "MOUNTED")
		require.NotContains(t, text, "UNSHARED")
		require.NotContains(t, text, sb.token)
		require.NotContains(t, text, "layerstack")
		if tc.want != "" {
			require.Contains(t, text, tc.want)
		}
	}
	// No CAP_SYS_MODULE (bit 16), CAP_SYS_ADMIN (bit 21) or CAP_SYS_NICE
	// (bit 23: real-time scheduling) in the effective or bounding set.
	for _, set := range []string{"CapEff", "CapBnd"} {
		out = sb.exec(a, "grep "+set+" /proc/self/status")
		var caps uint64
		_, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(out["output"].(string), set+":")), "%x", &caps)
		require.NoError(t, err, "%v", out)
		require.Zero(t, caps&(1<<16|1<<21|1<<23), "%s %x", set, caps)
	}
}

// TestCommandSemantics covers the command engine through the real daemon.
func TestCommandSemantics(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws := sb.session(nil)

	t.Run("500k lines paged", func(t *testing.T) {
		out := sb.exec(ws, "seq 1 500000")
		require.Equal(t, float64(500000), out["total_lines"])
		id := out["command_session_id"].(string)
		page := sb.ok("read_command_lines", map[string]any{"command_session_id": id, "start_offset": 0, "limit": 1000})
		require.True(t, strings.HasPrefix(page["output"].(string), "1\n2\n3\n"))
		last := sb.ok("read_command_lines", map[string]any{"command_session_id": id, "start_offset": 499990, "limit": 1000})
		require.True(t, strings.HasSuffix(last["output"].(string), "499999\n500000"), "%q", last["output"])
	})
	t.Run("stdout and stderr apart", func(t *testing.T) {
		out := sb.exec(ws, "echo out; echo err >&2")
		require.Equal(t, "out", strings.TrimSpace(out["stdout"].(string)))
		require.Equal(t, "err", strings.TrimSpace(out["stderr"].(string)))
	})
	t.Run("stdin", func(t *testing.T) {
		out := sb.ok("exec_command", map[string]any{"cmd": "read x; echo got $x", "workspace_session_id": ws, "yield_time_ms": 200})
		require.Equal(t, "running", out["status"])
		id := out["command_session_id"].(string)
		out = sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "hello\n", "yield_time_ms": 5000})
		require.Equal(t, "ok", out["status"])
		require.Contains(t, out["output"], "got hello")
	})
	t.Run("ctrl-c cancels", func(t *testing.T) {
		out := sb.ok("exec_command", map[string]any{"cmd": "sleep 60", "workspace_session_id": ws, "yield_time_ms": 100})
		id := out["command_session_id"].(string)
		out = sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "\x03", "yield_time_ms": 5000})
		require.Equal(t, "cancelled", out["status"])
		require.Equal(t, float64(130), out["exit_code"])
	})
	t.Run("timeout", func(t *testing.T) {
		out := sb.ok("exec_command", map[string]any{"cmd": "sleep 60", "workspace_session_id": ws, "timeout_ms": 300, "yield_time_ms": 10000})
		require.Equal(t, "timed_out", out["status"])
		require.Equal(t, float64(124), out["exit_code"])
	})
	t.Run("background children do not pin completion", func(t *testing.T) {
		start := time.Now()
		out := sb.exec(ws, "sleep 100 & echo started")
		require.Equal(t, "ok", out["status"])
		require.Less(t, time.Since(start), 20*time.Second)
	})
	t.Run("a command up to the cap runs, one past it is refused", func(t *testing.T) {
		// A comment fills the command to exactly api.MaxCommandBytes.
		head := "echo ran #"
		out := sb.exec(ws, head+strings.Repeat("x", api.MaxCommandBytes-len(head)))
		require.Equal(t, "ok", out["status"], "%v", out)
		require.Equal(t, "ran", strings.TrimSpace(out["stdout"].(string)))
		e := sb.fail("exec_command", map[string]any{"cmd": head + strings.Repeat("x", api.MaxCommandBytes+1-len(head)), "workspace_session_id": ws}, "invalid_request")
		require.Equal(t, "cmd", e["details"].(map[string]any)["arg"])
		e = sb.fail("exec_command", map[string]any{"cmd": "true", "env": map[string]any{"BIG": strings.Repeat("x", api.MaxCommandBytes)}}, "invalid_request")
		require.Equal(t, "env", e["details"].(map[string]any)["arg"])
	})
	t.Run("destroy refused while a command runs", func(t *testing.T) {
		out := sb.ok("exec_command", map[string]any{"cmd": "sleep 60", "workspace_session_id": ws, "yield_time_ms": 100})
		e := sb.fail("destroy_workspace_session", map[string]any{"workspace_session_id": ws}, "operation_failed")
		require.Contains(t, e["details"].(map[string]any)["active_command_session_ids"], out["command_session_id"])
		sb.ok("cancel_command", map[string]any{"command_session_id": out["command_session_id"]})
	})
}

// TestFileOperationsRefuseHostileInput.
func TestFileOperationsRefuseHostileInput(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws := sb.session(nil)
	sb.exec(ws, "ln -s / rootlink; ln -s .. uplink; mkdir -p d; ln -s /etc d/etclink; printf 'x%.0s' $(seq 1 5000000) > big.txt")
	for _, p := range []string{"../etc/passwd", "a/../../etc/passwd", "/etc/passwd", "f\x00.txt"} {
		sb.fail("file_read", map[string]any{"path": p, "workspace_session_id": ws}, "invalid_request")
		sb.fail("file_write", map[string]any{"path": p, "content": "x", "workspace_session_id": ws}, "invalid_request")
	}
	// File operations never follow a symlink (as sessionless ones refuse
	// them): not out of the workspace, and not silently re-rooted in it.
	for _, p := range []string{"rootlink/etc/passwd", "uplink/uplink/etc/passwd", "d/etclink/passwd", "rootlink/escaped.txt"} {
		e := sb.fail("file_read", map[string]any{"path": p, "workspace_session_id": ws}, "invalid_request")
		require.Contains(t, e["message"], "symlink")
		sb.fail("file_write", map[string]any{"path": p, "content": "x", "workspace_session_id": ws}, "invalid_request")
	}
	sb.fail("file_read", map[string]any{"path": "escaped.txt", "workspace_session_id": ws}, "not_found")
	sb.fail("file_read", map[string]any{"path": "etc/passwd", "workspace_session_id": ws}, "not_found")
	// Limits.
	e := sb.fail("file_read", map[string]any{"path": "big.txt", "workspace_session_id": ws}, "invalid_request")
	require.Contains(t, e["message"], "exceeds the maximum")
	e = sb.fail("file_edit", map[string]any{"path": "big.txt", "edits": []map[string]any{{"old_string": "x", "new_string": "y", "replace_all": true}}, "workspace_session_id": ws}, "invalid_request")
	require.Contains(t, e["message"], "file is too large")
	huge := strings.Repeat("z", 17<<20)
	sb.fail("file_write", map[string]any{"path": "huge.txt", "content": huge, "workspace_session_id": ws}, "request_too_large")
	// Tokens.
	for _, auth := range []string{"", "Bearer ", "Bearer wrong-token-0123456789", "Basic " + sb.token, "Bearer " + strings.Repeat("a", 5000)} {
		status, out := sb.callWith("list_workspace_sessions", map[string]any{}, auth)
		require.Equal(t, http.StatusUnauthorized, status)
		require.Equal(t, "unauthorized", out["error"].(map[string]any)["kind"])
	}
	// The daemon's profiles and execution trace need the token too.
	for _, path := range []string{"/debug/pprof/trace?seconds=1", "/debug/pprof/profile?seconds=1", "/debug/pprof/goroutine"} {
		for _, auth := range []string{"", "Bearer wrong-token-0123456789"} {
			req, _ := http.NewRequest(http.MethodGet, sb.baseURL+path, nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := sb.client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s with %q", path, auth)
		}
	}
	// Sessionless edits keep the exec bit.
	sb.ok("file_edit", map[string]any{"path": "run.sh", "edits": []map[string]any{{"old_string": "echo run", "new_string": "echo ran"}}})
	out := sb.exec("", "ls -l run.sh; ./run.sh")
	require.Contains(t, out["output"], "rwx")
	require.Contains(t, out["output"], "ran")
}

// TestSessionsSurviveRestarts: unpublished work survives a daemon restart
// and a container restart.
func TestSessionsSurviveRestarts(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws := sb.session(nil)
	sb.exec(ws, "echo unpublished > wip.txt")

	// Kill the daemon (not PID 1): the supervisor restarts it.
	sb.restartDaemon()
	require.Equal(t, "unpublished\n", sb.read(ws, "wip.txt"))
	require.Equal(t, "ok", sb.exec(ws, "cat wip.txt")["status"])

	// Restart the whole container.
	docker(t, "restart", "-t", "5", sb.name)
	sb.connect()
	require.Equal(t, "unpublished\n", sb.read(ws, "wip.txt"))
	out := sb.exec(ws, "cat wip.txt")
	require.Contains(t, out["output"], "unpublished")
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})
	require.Equal(t, "unpublished\n", sb.read("", "wip.txt"))
}

// TestIsolatedSessionsShareAPort: two isolated sessions listen on the same
// port and the daemon's forward routes reach the right one.
func TestIsolatedSessionsShareAPort(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	var ids []string
	for i := 0; i < 2; i++ {
		ws := sb.session(map[string]any{"network_profile": "isolated"})
		sb.exec(ws, fmt.Sprintf("mkdir -p www && echo session-%d > www/who.txt", i))
		out := sb.ok("exec_command", map[string]any{"cmd": "busybox httpd -f -p 8080 -h www", "workspace_session_id": ws, "yield_time_ms": 300})
		require.Equal(t, "running", out["status"], "%v", out)
		ids = append(ids, ws)
	}
	for i, ws := range ids {
		var body string
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/forward/isolated=%s/8080/who.txt", sb.baseURL, ws), nil)
			req.Header.Set("Authorization", "Bearer "+sb.token)
			resp, err := sb.client.Do(req)
			if !assert.NoError(c, err, "forward to %s", ws) {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			assert.Equal(c, 200, resp.StatusCode, "forward to %s: %s", ws, body)
		}, 10*time.Second, 100*time.Millisecond)
		require.Equal(t, fmt.Sprintf("session-%d\n", i), body)
	}
	req, _ := http.NewRequest(http.MethodGet, sb.baseURL+"/forward/isolated=ws-nope/8080/", nil)
	req.Header.Set("Authorization", "Bearer "+sb.token)
	resp, err := sb.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	req, _ = http.NewRequest(http.MethodGet, sb.baseURL+"/forward/shared/8080/", nil)
	resp, err = sb.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "forwards need the token too")
}

// TestLostLeaseAtRestart: the state a power cut can leave after a create
// (the session's record on disk, its lease not: they are flushed side by
// side), made here by removing the lease files, then a container restart.
// A session with nothing written starts on the head under a new lease and
// runs; one holding work is not restored, and its work stays on disk.
func TestLostLeaseAtRestart(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	empty := sb.session(nil)
	work := sb.session(nil)
	sb.exec(work, "echo unpublished > wip.txt")
	leaseOf := func(ws string) string {
		var rec struct {
			LeaseID string `json:"lease_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(docker(t, "exec", sb.name, "cat", "/eos/sessions/"+ws+"/session.json")), &rec))
		require.NotEmpty(t, rec.LeaseID)
		return rec.LeaseID
	}
	lost := leaseOf(empty)
	docker(t, "exec", sb.name, "rm", "/eos/layerstack/leases/"+lost+".json", "/eos/layerstack/leases/"+leaseOf(work)+".json")

	docker(t, "restart", "-t", "5", sb.name)
	sb.connect()
	require.NotEqual(t, lost, leaseOf(empty), "a new lease")
	out := sb.exec(empty, "cat f.txt && echo ran")
	require.Equal(t, "ok", out["status"], "%v", out)
	require.Contains(t, out["output"], "ran")
	states := map[string]string{}
	for _, s := range sb.ok("list_workspace_sessions", map[string]any{})["workspace_sessions"].([]any) {
		m := s.(map[string]any)
		states[m["workspace_session_id"].(string)] = m["finalization_state"].(string)
	}
	require.Equal(t, "active", states[empty])
	require.Equal(t, "finalize_failed", states[work], "not restored onto a base its work was not made on")
	require.Contains(t, docker(t, "exec", sb.name, "sh", "-c", "cat /eos/sessions/"+work+"/upper*/wip.txt"), "unpublished")
}
