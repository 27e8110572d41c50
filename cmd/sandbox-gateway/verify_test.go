package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
)

// opFull is drill.op with the error's details.
func (d *drill) opFull(name string, args map[string]any) (map[string]any, *api.Error) {
	d.t.Helper()
	_, b, err := d.g.HTTPOp(name, map[string]any{"scope": map[string]any{"kind": "sandbox", "sandbox_id": d.id}, "args": args,
		"request_id": "verify-" + client.NewRequestID()[:12]})
	require.NoError(d.t, err)
	var m map[string]any
	require.NoError(d.t, json.Unmarshal(b, &m), "%s", b)
	if e, ok := m["error"].(map[string]any); ok {
		det, _ := e["details"].(map[string]any)
		return nil, &api.Error{Kind: fmt.Sprint(e["kind"]), Message: fmt.Sprint(e["message"]), Details: det}
	}
	return m, nil
}

// throwaways lists the daemon's verification sessions.
func (d *drill) throwaways() []string {
	d.t.Helper()
	var out []string
	for _, s := range d.must("list_workspace_sessions", nil)["workspace_sessions"].([]any) {
		m := s.(map[string]any)
		if strings.HasPrefix(fmt.Sprint(m["agent"]), "verify:") {
			out = append(out, fmt.Sprint(m["workspace_session_id"]))
		}
	}
	return out
}

// TestVerifiedPublish: publish_workspace_session --verify against the real
// stack (gateway, embedded Temporal, worker, Docker, daemon). A passing
// command commits; a failing one (exit 3) rejects with its output and exit
// code, the head unchanged and the session active with its work; two
// concurrent verified publishes are serialized (the second verified on the
// head the first committed) and both commit, or the second reports its
// conflict; bad input is refused with nothing changed; the throwaway
// sessions are gone after every path, and a container restart in the middle
// of a verification commits once or rejects, leaving no throwaway.
func TestVerifiedPublish(t *testing.T) {
	g, id, _ := gatewayWithSandbox(t, "one\ntwo\nthree\n")
	d := &drill{t: t, g: g, id: id}
	session := func(path, content string) string {
		s := d.must("create_workspace_session", nil)["workspace_session_id"].(string)
		d.must("file_write", map[string]any{"workspace_session_id": s, "path": path, "content": content})
		return s
	}
	read := func(path string) string {
		m := d.must("file_read", map[string]any{"path": path})
		return strings.TrimRight(fmt.Sprint(m["content"]), "\n")
	}

	t.Run("a passing command commits", func(t *testing.T) {
		d.t = t
		s := session("a.txt", "alpha")
		v := d.manifestVersion()
		// The command sees the would-be head: the head plus the change set.
		out := d.must("publish_workspace_session", map[string]any{"workspace_session_id": s, "verify": "cat a.txt f.txt && test -f a.txt"})
		require.Equal(t, true, out["destroyed"], "%v", out)
		vr := out["verify"].(map[string]any)
		require.Equal(t, true, vr["passed"])
		require.EqualValues(t, 0, vr["exit_code"])
		require.Contains(t, vr["output_tail"], "alpha")
		require.Contains(t, vr["output_tail"], "three")
		require.EqualValues(t, v, vr["verified_head"].(map[string]any)["manifest_version"])
		require.Equal(t, v+1, d.manifestVersion())
		require.Equal(t, "alpha", read("a.txt"))
		require.Empty(t, d.throwaways())
	})

	t.Run("a failing command rejects; the session keeps its work", func(t *testing.T) {
		d.t = t
		s := session("b.txt", "beta")
		v := d.manifestVersion()
		_, err := d.opFull("publish_workspace_session", map[string]any{"workspace_session_id": s, "verify": "echo boom >&2; echo out; exit 3"})
		require.NotNil(t, err)
		require.Equal(t, api.KindOperationFailed, err.Kind, "%v", err)
		require.Contains(t, err.Message, "exited 3")
		require.Equal(t, "verify", err.Details["stage"])
		require.Equal(t, "verify_failed", err.Details["reason"])
		require.EqualValues(t, 3, err.Details["exit_code"])
		require.Contains(t, err.Details["output_tail"], "boom")
		require.Contains(t, err.Details["output_tail"], "out")
		require.EqualValues(t, v, err.Details["verified_head"].(map[string]any)["manifest_version"])
		require.Equal(t, v, d.manifestVersion(), "nothing committed")
		_, nf := d.opFull("file_read", map[string]any{"path": "b.txt"})
		require.NotNil(t, nf, "b.txt is not in the head")
		// The session is active with its work, and publishes.
		m := d.must("exec_command", map[string]any{"workspace_session_id": s, "cmd": "cat b.txt"})
		require.Contains(t, fmt.Sprint(m["output"]), "beta")
		require.Empty(t, d.throwaways())
		d.must("publish_workspace_session", map[string]any{"workspace_session_id": s, "verify": "test -f b.txt"})
		require.Equal(t, v+1, d.manifestVersion())
	})

	t.Run("concurrent verified publishes are serialized", func(t *testing.T) {
		d.t = t
		s1, s2 := session("c1.txt", "c1"), session("c2.txt", "c2")
		v := d.manifestVersion()
		var wg sync.WaitGroup
		outs := make([]map[string]any, 2)
		errs := make([]*api.Error, 2)
		publish := func(i int, s, verify string) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i], errs[i] = d.opFull("publish_workspace_session", map[string]any{"workspace_session_id": s, "verify": verify})
			}()
		}
		// The first verification holds until the test releases it (a file in
		// its throwaway session), so the second is sent while the first
		// verifies however slow the machine is: no timing guess.
		publish(0, s1, "while [ ! -e /tmp/release ]; do sleep 0.1; done; ls")
		var throwaway string
		require.Eventually(t, func() bool {
			tw := d.throwaways()
			if len(tw) == 1 {
				throwaway = tw[0]
			}
			return throwaway != ""
		}, 2*time.Minute, 50*time.Millisecond, "the first publish's verification never started")
		publish(1, s2, "ls")
		// While the first verifies, the snapshot shows the second queued behind it.
		require.Eventually(t, func() bool {
			snap, err := d.opFull("snapshot", nil)
			require.Nil(t, err, "%v", err)
			q, ok := snap["publish_queue"].([]any)
			require.True(t, ok, "the snapshot has publish_queue: %v", snap["publish_queue"])
			require.NotEmpty(t, q, "the first publish is verifying")
			first := q[0].(map[string]any)
			require.EqualValues(t, 1, first["position"])
			require.Equal(t, "verifying", first["state"])
			require.NotEmpty(t, first["started_at"])
			return len(q) == 2
		}, 2*time.Minute, 50*time.Millisecond, "the second publish never queued behind the first")
		require.Len(t, d.throwaways(), 1, "the second waits without a throwaway session of its own")
		d.must("exec_command", map[string]any{"workspace_session_id": throwaway, "cmd": "touch /tmp/release"})
		wg.Wait()
		require.Nil(t, errs[0], "%v", errs[0])
		require.Nil(t, errs[1], "%v", errs[1])
		require.Equal(t, v+2, d.manifestVersion(), "both committed")
		heads := []float64{outs[0]["verify"].(map[string]any)["verified_head"].(map[string]any)["manifest_version"].(float64),
			outs[1]["verify"].(map[string]any)["verified_head"].(map[string]any)["manifest_version"].(float64)}
		require.ElementsMatch(t, []float64{v, v + 1}, heads, "one verified on the head the other committed")
		require.Equal(t, "c1", read("c1.txt"))
		require.Equal(t, "c2", read("c2.txt"))

		// The same line changed by both: the second's conflict is reported
		// before its command runs.
		e1 := d.must("create_workspace_session", nil)["workspace_session_id"].(string)
		e2 := d.must("create_workspace_session", nil)["workspace_session_id"].(string)
		d.must("file_write", map[string]any{"workspace_session_id": e1, "path": "f.txt", "content": "one\nTWO\nthree\n"})
		d.must("file_write", map[string]any{"workspace_session_id": e2, "path": "f.txt", "content": "one\nDOS\nthree\n"})
		d.must("publish_workspace_session", map[string]any{"workspace_session_id": e1, "verify": "grep TWO f.txt"})
		v = d.manifestVersion()
		_, err := d.opFull("publish_workspace_session", map[string]any{"workspace_session_id": e2, "verify": "touch /tmp/ran; exit 0"})
		require.NotNil(t, err)
		require.Equal(t, api.KindOperationFailed, err.Kind)
		require.Contains(t, err.Message, "conflicting path")
		require.NotEmpty(t, err.Details["conflicts"])
		require.Equal(t, v, d.manifestVersion())
		require.Empty(t, d.throwaways())
	})

	t.Run("bad input is refused and changes nothing", func(t *testing.T) {
		d.t = t
		s := session("bad.txt", "bad")
		v := d.manifestVersion()
		for _, args := range []map[string]any{
			{"verify": ""},
			{"verify": "   "},
			{"verify": "true", "verify_timeout_s": 0},
			{"verify": "true", "verify_timeout_s": 1 << 30},
			{"verify": "true", "verify_retries": 99},
			{"verify": "true", "verify_retries": -1},
		} {
			args["workspace_session_id"] = s
			_, err := d.opFull("publish_workspace_session", args)
			require.NotNil(t, err, "%v", args)
			require.Equal(t, api.KindInvalidRequest, err.Kind, "%v: %v", args, err)
		}
		require.Equal(t, v, d.manifestVersion())
		m := d.must("exec_command", map[string]any{"workspace_session_id": s, "cmd": "cat bad.txt"})
		require.Contains(t, fmt.Sprint(m["output"]), "bad")
		// The CLI's flags come from the catalog.
		r := runCLI(t, g, "sandbox-runtime-cli", "publish_workspace_session", "--sandbox-id", id, "--workspace-session-id", s,
			"--verify", "test -f bad.txt", "--verify-timeout", "30", "--verify-retries", "0")
		require.Equal(t, 0, r.code, "%v", r)
		require.Equal(t, v+1, d.manifestVersion())
	})

	t.Run("a container restart in the middle of a verification", func(t *testing.T) {
		d.t = t
		s := session("crash.txt", "crash")
		v := d.manifestVersion()
		done := make(chan *api.Error, 1)
		go func() {
			_, err := d.opFull("publish_workspace_session", map[string]any{"workspace_session_id": s, "verify": "sleep 5"})
			done <- err
		}()
		// Wait until its throwaway session runs.
		for len(d.throwaways()) == 0 {
			select {
			case err := <-done:
				t.Fatalf("the publish ended before its verification was seen: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		docker(t, "restart", "-t", "1", d.container())
		err := <-done
		require.Empty(t, d.throwaways(), "the throwaway session is gone after the restart")
		if err == nil {
			require.Equal(t, v+1, d.manifestVersion(), "committed exactly once")
			return
		}
		t.Logf("the publish caught by the restart was rejected: %v", err)
		require.Equal(t, v, d.manifestVersion(), "a rejected publish commits nothing")
		d.servedWithin(time.Now(), 60*time.Second, s, "crash.txt", "crash")
		d.must("publish_workspace_session", map[string]any{"workspace_session_id": s, "verify": "test -f crash.txt"})
		require.Equal(t, v+1, d.manifestVersion())
	})
}
