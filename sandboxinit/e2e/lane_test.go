package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// laneState is the daemon view's background lane.
func (sb *sandbox) laneState() (running, queued int) {
	sb.t.Helper()
	out := sb.ok("daemon", map[string]any{})
	ln := out["daemon"].(map[string]any)["background_lane"].(map[string]any)
	return int(ln["running"].(float64)), int(ln["queued"].(float64))
}

// TestExecAnswersWhileTheBackgroundLaneIsFull: a real daemon with one
// background slot. A publish holds that slot (it waits for its
// transaction's lock, which a verified publish of the same txid holds
// while its command blocks on a socket the test controls), and a session
// create waits behind it. Commands and file operations in another session
// answer meanwhile — the lane still shows the publish running and the
// create queued after each of them. Then the test lets the verification
// end: the publish and the create complete in order, and a command in the
// session created through the (niced) lane runs at nice 0, as does its
// init.
func TestExecAnswersWhileTheBackgroundLaneIsFull(t *testing.T) {
	sb := startSandboxWith(t, "eos-test-busybox:1", map[string]string{"f.txt": "one\n"}, nil,
		[]string{"--background-lanes", "1", "--background-nice", "10"})
	a := sb.session(nil)
	b := sb.session(nil)
	sb.ok("file_write", map[string]any{"path": "a.txt", "content": "from a\n", "workspace_session_id": a})

	type answer struct {
		status int
		out    map[string]any
	}
	call := func(op string, args map[string]any) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			st, out := sb.call(op, args)
			ch <- answer{st, out}
		}()
		return ch
	}
	pending := func(ch <-chan answer) bool {
		select {
		case ans := <-ch:
			t.Fatalf("answered while it should be held: %d %v", ans.status, ans.out)
		default:
		}
		return true
	}
	// A verified publish (not laned) holds txid tx-held's lock while its
	// command listens on 127.0.0.1:7777 (shared sessions share the
	// sandbox's network).
	verified := call("publish_workspace_session", map[string]any{"workspace_session_id": a, "exactly_once": true, "txid": "tx-held",
		"verify": map[string]any{"cmd": "nc -l -p 7777 >/dev/null", "timeout_ms": 120000, "retries": 0}})
	for {
		out := sb.exec(b, "cat /proc/net/tcp /proc/net/tcp6 | grep -q ':1E61 '")
		if out["exit_code"] == float64(0) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The same txid again, without verify: laned, it takes the one slot and
	// waits for the transaction's lock.
	held := call("publish_workspace_session", map[string]any{"workspace_session_id": a, "exactly_once": true, "txid": "tx-held"})
	for r, _ := sb.laneState(); r != 1; r, _ = sb.laneState() {
		time.Sleep(20 * time.Millisecond)
	}
	created := call("create_workspace_session", map[string]any{"agent": "queued"})
	for _, q := sb.laneState(); q != 1; _, q = sb.laneState() {
		time.Sleep(20 * time.Millisecond)
	}

	// Interactive work answers with the lane full.
	for i := 0; i < 5; i++ {
		out := sb.exec(b, "echo interactive")
		require.Equal(t, float64(0), out["exit_code"], "%v", out)
		require.Contains(t, out["output"], "interactive")
	}
	sb.ok("file_write", map[string]any{"path": "b.txt", "content": "from b\n", "workspace_session_id": b})
	require.Equal(t, "from b\n", sb.read(b, "b.txt"))
	sb.ok("file_edit", map[string]any{"path": "b.txt", "workspace_session_id": b,
		"edits": []any{map[string]any{"old_string": "from b", "new_string": "edited"}}})
	require.Equal(t, "one\n", sb.read(b, "f.txt"))
	sb.ok("list_workspace_sessions", map[string]any{})
	running, queued := sb.laneState()
	require.Equal(t, 1, running, "the publish still holds the slot")
	require.Equal(t, 1, queued, "the create still waits")
	pending(held)
	pending(created)
	pending(verified)

	// Let the verification end: everything queued completes, in order.
	sb.exec(b, "echo done | nc 127.0.0.1 7777")
	v := <-verified
	require.Equal(t, http.StatusOK, v.status, "%v", v.out)
	h := <-held
	require.Equal(t, http.StatusOK, h.status, "a retry of the committed txid answers as the first call: %v", h.out)
	c := <-created
	require.Equal(t, http.StatusOK, c.status, "%v", c.out)
	running, queued = sb.laneState()
	require.Equal(t, 0, running)
	require.Equal(t, 0, queued)

	// Created on a niced thread, but its init and its commands are not niced.
	ws := c.out["workspace_session_id"].(string)
	out := sb.exec(ws, "awk '{print $19}' /proc/self/stat; awk '{print $19}' /proc/1/stat")
	require.Equal(t, float64(0), out["exit_code"], "%v", out)
	require.Equal(t, []string{"0", "0"}, strings.Fields(out["output"].(string)), "nice of a command and of the session's init")
	require.Equal(t, "from a\n", sb.read(ws, "a.txt"), "the new session starts on the head the verified publish made")
}
