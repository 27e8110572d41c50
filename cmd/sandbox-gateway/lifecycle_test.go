package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// lcOp posts one op over HTTP and returns its result or its error envelope
// (kind, message, details) and the HTTP status.
func lcOp(t *testing.T, g *gatewayProc, id, name string, args map[string]any) (map[string]any, map[string]any, int) {
	t.Helper()
	o, ok := api.LookupOp(name)
	require.True(t, ok, name)
	if args == nil {
		args = map[string]any{}
	}
	scope := map[string]any{"kind": "sandbox", "sandbox_id": id}
	if o.Scope == api.ScopeSystem {
		scope = map[string]any{"kind": "system"}
		if _, set := args["sandbox_id"]; !set && id != "" {
			args["sandbox_id"] = id
		}
	}
	st, b, err := g.HTTPOp(name, map[string]any{"scope": scope, "args": args, "request_id": "lc-" + client.NewRequestID()[:12]})
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	if e, ok := m["error"].(map[string]any); ok {
		return nil, e, st
	}
	require.Equal(t, http.StatusOK, st, "%s", b)
	return m, nil, st
}

func lcMust(t *testing.T, g *gatewayProc, id, name string, args map[string]any) map[string]any {
	t.Helper()
	m, e, _ := lcOp(t, g, id, name, args)
	require.Nil(t, e, "%s: %v", name, e)
	return m
}

func lcRefused(t *testing.T, g *gatewayProc, id, name string, args map[string]any, kind string) map[string]any {
	t.Helper()
	_, e, st := lcOp(t, g, id, name, args)
	require.NotNil(t, e, "%s %v was not refused", name, args)
	require.Equal(t, kind, e["kind"], "%s %v: %v", name, args, e)
	require.Equal(t, api.HTTPStatus(kind), st)
	return e
}

// eventually polls cond every 200 ms for at most max (a bound against a
// hang, not a speed assertion) and fails with what it saw last.
func eventually(t *testing.T, max time.Duration, what string, cond func() (bool, any)) {
	t.Helper()
	deadline := time.Now().Add(max)
	var last any
	for time.Now().Before(deadline) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last: %v", what, max, last)
}

func containerRunning(t *testing.T, id string) string {
	t.Helper()
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.Running}}", workflows.ContainerName(id)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.TrimSpace(string(out))
}

func volumeExists(t *testing.T, id string) bool {
	return exec.Command("docker", "volume", "inspect", workflows.VolumeName(id)).Run() == nil
}

func lifecycleOf(t *testing.T, rec map[string]any) map[string]any {
	t.Helper()
	lc, ok := rec["lifecycle"].(map[string]any)
	require.True(t, ok, "record without lifecycle: %v", rec)
	return lc
}

// TestLifecycleUsersTurnOn drives the lifecycle a user switches on through
// a real gateway process (embedded Temporal, workers, Docker, daemon):
// bad durations refused with nothing created; the gateway's default idle
// TTL archives an idle session, which is listed and restored with its
// file and then publishes; pause stops the container keeping the volume,
// runtime and lifecycle ops are refused with failed_precondition and a
// hint, both ops are idempotent, resume brings the session's unpublished
// work back and it publishes; a short ttl pauses (never deletes) and the
// paused sandbox can be destroyed; a gateway SIGKILLed right after a
// pause or a resume was accepted ends paused or running, never stuck.
func TestLifecycleUsersTurnOn(t *testing.T) {
	g := testenv.StartGatewayWith(t, testenv.GatewayOptions{Args: []string{"--default-session-idle-ttl", "15s"}})
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "f.txt"), "base\n")
	img := testenv.Images[0]

	// Bad input: refused before any workflow starts, nothing created.
	before := len(lcMust(t, g, "", "list_sandboxes", nil)["sandboxes"].([]any))
	for _, bad := range []map[string]any{
		{"ttl": "-5m"}, {"ttl": "soon"}, {"ttl": "9000h"}, {"session_idle_ttl": "1ms"}, {"session_idle_ttl": 30},
	} {
		args := map[string]any{"image": img, "workspace_root": ws}
		for k, v := range bad {
			args[k] = v
		}
		e := lcRefused(t, g, "", "create_sandbox", args, api.KindInvalidRequest)
		details, _ := e["details"].(map[string]any)
		require.NotEmpty(t, details["arg"], "%v", e)
	}
	require.Len(t, lcMust(t, g, "", "list_sandboxes", nil)["sandboxes"].([]any), before, "a refused create_sandbox creates nothing")
	for _, op := range []string{"pause_sandbox", "resume_sandbox"} {
		lcRefused(t, g, "", op, map[string]any{"sandbox_id": "eos-does-not-exist"}, api.KindInvalidRequest)
		lcRefused(t, g, "", op, map[string]any{"sandbox_id": "../x"}, api.KindInvalidRequest)
	}
	r := runCLI(t, g, mgr, "create_sandbox", "--image", img, "--workspace-root", ws, "--ttl", "forever")
	require.Equal(t, 1, r.code, "%s", r.stderr)
	require.Equal(t, api.KindInvalidRequest, r.errEnv["kind"])

	// A: the gateway's default idle TTL (15s) archives an idle session.
	recA := mustCLI(t, g, mgr, "create_sandbox", "--image", img, "--workspace-root", ws)
	a := recA["id"].(string)
	cleanupSandbox(t, a)
	require.Equal(t, "15s", lifecycleOf(t, recA)["session_idle_ttl"])
	require.Equal(t, "0", lifecycleOf(t, recA)["ttl"])
	wsA := lcMust(t, g, a, "create_workspace_session", map[string]any{"agent": "agent-a"})["workspace_session_id"].(string)
	lcMust(t, g, a, "file_write", map[string]any{"workspace_session_id": wsA, "path": "notes.md", "content": "kept\n"})
	var archived map[string]any
	start0 := time.Now()
	eventually(t, 3*time.Minute, "the idle session archived", func() (bool, any) {
		list := lcMust(t, g, a, "list_archived_sessions", nil)["archived_sessions"].([]any)
		for _, x := range list {
			if m := x.(map[string]any); m["workspace_session_id"] == wsA {
				archived = m
				return true, list
			}
		}
		return false, list
	})
	t.Logf("idle ttl 15s: archived %s after the last use", time.Since(start0).Round(time.Millisecond))
	require.Equal(t, "agent-a", archived["agent"])
	require.EqualValues(t, 1, archived["files_changed"])
	require.NotEmpty(t, archived["archived_at"])
	eventually(t, time.Minute, "the workflow no longer counts it", func() (bool, any) {
		rec := lcMust(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": a})
		return rec["workspace_session_count"] == float64(0), rec
	})
	lcRefused(t, g, a, "file_read", map[string]any{"workspace_session_id": wsA, "path": "notes.md"}, api.KindNotFound)
	lcRefused(t, g, a, "restore_workspace_session", map[string]any{"workspace_session_id": "ws-000000000000"}, api.KindNotFound)
	lcRefused(t, g, a, "restore_workspace_session", map[string]any{"workspace_session_id": "../x"}, api.KindInvalidRequest)
	restored := mustCLI(t, g, rt, "--sandbox-id", a, "restore_workspace_session", "--workspace-session-id", wsA)
	require.Equal(t, "active", restored["state"])
	got := lcMust(t, g, a, "file_read", map[string]any{"workspace_session_id": wsA, "path": "notes.md"})
	require.Equal(t, "kept", got["content"], "the archived session's unpublished work is back")
	lcRefused(t, g, a, "restore_workspace_session", map[string]any{"workspace_session_id": wsA}, api.KindFailedPrecondition)
	pub := lcMust(t, g, a, "publish_workspace_session", map[string]any{"workspace_session_id": wsA})
	require.Equal(t, true, pub["destroyed"], "%v", pub)
	require.Equal(t, "kept", lcMust(t, g, a, "file_read", map[string]any{"path": "notes.md"})["content"])

	// B: pause and resume, with unpublished work in a session.
	recB := lcMust(t, g, "", "create_sandbox", map[string]any{"image": img, "workspace_root": ws, "ttl": "1h", "session_idle_ttl": "0"})
	b := recB["id"].(string)
	cleanupSandbox(t, b)
	lcB := lifecycleOf(t, recB)
	require.Equal(t, "1h0m0s", lcB["ttl"])
	require.Equal(t, "0", lcB["session_idle_ttl"])
	require.NotEmpty(t, lcB["expires_at"])
	wsB := lcMust(t, g, b, "create_workspace_session", nil)["workspace_session_id"].(string)
	lcMust(t, g, b, "file_write", map[string]any{"workspace_session_id": wsB, "path": "wip.txt", "content": "unpublished\n"})
	// A pause while a publish is in flight is refused and says which: the
	// daemon is frozen (docker pause) so the publish cannot end meanwhile.
	wsP := lcMust(t, g, b, "create_workspace_session", nil)["workspace_session_id"].(string)
	lcMust(t, g, b, "file_write", map[string]any{"workspace_session_id": wsP, "path": "p.txt", "content": "published\n"})
	docker(t, "pause", workflows.ContainerName(b))
	acc := lcMust(t, g, b, "publish_workspace_session", map[string]any{"workspace_session_id": wsP, "async": true})
	require.Equal(t, "accepted", acc["status"], "%v", acc)
	e := lcRefused(t, g, "", "pause_sandbox", map[string]any{"sandbox_id": b}, api.KindOperationConflict)
	require.Contains(t, fmt.Sprint(e["details"].(map[string]any)["publishing"]), wsP, "%v", e)
	require.Contains(t, fmt.Sprint(e["message"]), wsP)
	require.Equal(t, "ready", lcMust(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": b})["state"], "a refused pause changes nothing")
	docker(t, "unpause", workflows.ContainerName(b))
	done := lcMust(t, g, "", "wait_operation", map[string]any{"workflow_id": acc["workflow_id"], "update_id": acc["update_id"]})
	require.Equal(t, "completed", done["status"], "%v", done)
	require.Equal(t, "published", lcMust(t, g, b, "file_read", map[string]any{"path": "p.txt"})["content"])

	start := time.Now()
	p := mustCLI(t, g, mgr, "pause_sandbox", "--sandbox-id", b)
	t.Logf("pause_sandbox answered in %s", time.Since(start).Round(time.Millisecond))
	require.Equal(t, "paused", p["state"])
	require.Equal(t, false, p["already"])
	require.Equal(t, "false", containerRunning(t, b), "the container is stopped")
	require.True(t, volumeExists(t, b), "the state volume is kept")
	e = lcRefused(t, g, b, "exec_command", map[string]any{"cmd": "true"}, api.KindFailedPrecondition)
	require.Equal(t, "resume_sandbox", e["details"].(map[string]any)["hint"], "%v", e)
	lcRefused(t, g, b, "file_read", map[string]any{"workspace_session_id": wsB, "path": "wip.txt"}, api.KindFailedPrecondition)
	lcRefused(t, g, b, "create_workspace_session", nil, api.KindFailedPrecondition)
	lcRefused(t, g, b, "publish_workspace_session", map[string]any{"workspace_session_id": wsB}, api.KindFailedPrecondition)
	again := lcMust(t, g, "", "pause_sandbox", map[string]any{"sandbox_id": b})
	require.Equal(t, true, again["already"], "pausing a paused sandbox is fine and says so")
	rec := lcMust(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": b})
	require.Equal(t, "paused", rec["state"])
	require.Equal(t, "user", lifecycleOf(t, rec)["paused_by"])
	snap := lcMust(t, g, b, "snapshot", nil)
	require.Equal(t, "paused", snap["availability"], "%v", snap)
	require.Equal(t, "paused", snap["lifecycle_state"])

	start = time.Now()
	res := mustCLI(t, g, mgr, "resume_sandbox", "--sandbox-id", b)
	t.Logf("resume_sandbox answered in %s", time.Since(start).Round(time.Millisecond))
	require.Equal(t, "ready", res["state"])
	require.Equal(t, false, res["already"])
	require.Equal(t, "true", containerRunning(t, b))
	got = lcMust(t, g, b, "file_read", map[string]any{"workspace_session_id": wsB, "path": "wip.txt"})
	require.Equal(t, "unpublished", got["content"], "resume brings the session back with its unpublished work")
	require.Equal(t, true, lcMust(t, g, "", "resume_sandbox", map[string]any{"sandbox_id": b})["already"])
	lcMust(t, g, b, "publish_workspace_session", map[string]any{"workspace_session_id": wsB, "keep": true})
	require.Equal(t, "unpublished", lcMust(t, g, b, "file_read", map[string]any{"path": "wip.txt"})["content"], "publish works after resume")
	rec = lcMust(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": b})
	require.NotEmpty(t, lifecycleOf(t, rec)["expires_at"], "the ttl counts again from the resume")
	snap = lcMust(t, g, b, "snapshot", nil)
	require.Equal(t, "1h0m0s", snap["lifecycle"].(map[string]any)["ttl"], "%v", snap)

	// C: a short ttl pauses the sandbox (the workflow's timer); never deleted.
	recC := mustCLI(t, g, mgr, "create_sandbox", "--image", img, "--workspace-root", ws, "--ttl", "3s")
	c := recC["id"].(string)
	cleanupSandbox(t, c)
	start = time.Now()
	eventually(t, 3*time.Minute, "the ttl pauses the sandbox", func() (bool, any) {
		rec := lcMust(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": c})
		return rec["state"] == "paused", rec
	})
	t.Logf("ttl 3s: paused %s after create returned", time.Since(start).Round(time.Millisecond))
	rec = lcMust(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": c})
	require.Equal(t, "ttl", lifecycleOf(t, rec)["paused_by"])
	require.Equal(t, "false", containerRunning(t, c))
	require.True(t, volumeExists(t, c), "a ttl pauses, never deletes")
	// The gateway still holds the endpoint it was created on: the refused
	// connection's look-up finds the sandbox paused and says so.
	e = lcRefused(t, g, c, "exec_command", map[string]any{"cmd": "true"}, api.KindFailedPrecondition)
	require.Equal(t, "resume_sandbox", e["details"].(map[string]any)["hint"], "%v", e)
	lcMust(t, g, "", "destroy_sandbox", map[string]any{"sandbox_id": c})
	lcRefused(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": c}, api.KindInvalidRequest)
	require.False(t, volumeExists(t, c), "a paused sandbox can be destroyed")

	// Crash: SIGKILL the gateway (its Temporal and worker with it) in the
	// middle of a pause — held in "pausing" by a refresh the frozen daemon
	// cannot answer — and right after a resume was accepted; started again
	// (with the start-up reconciler on), the sandbox ends paused, then
	// running, never stuck in between.
	restart := func() {
		g.Kill()
		o := g.Options()
		o.Reconcile = true // the reconciler must leave a paused sandbox alone
		g = testenv.StartGatewayWith(t, o)
	}
	settles := func(op, want string) {
		start := time.Now()
		eventually(t, 4*time.Minute, op+" completes after the crash", func() (bool, any) {
			rec, e, _ := lcOp(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": b})
			if e != nil {
				return false, e
			}
			return rec["state"] == want, rec
		})
		t.Logf("%s cut by a gateway SIGKILL: %s %s after the gateway was back", op, want, time.Since(start).Round(time.Millisecond))
		require.True(t, volumeExists(t, b))
	}
	docker(t, "pause", workflows.ContainerName(b))
	require.Equal(t, "accepted", lcMust(t, g, b, "refresh_workspace_session", map[string]any{"workspace_session_id": wsB, "async": true})["status"])
	require.Equal(t, "accepted", lcMust(t, g, "", "pause_sandbox", map[string]any{"sandbox_id": b, "async": true})["status"])
	eventually(t, time.Minute, "the pause waits for the refresh", func() (bool, any) {
		rec := lcMust(t, g, "", "inspect_sandbox", map[string]any{"sandbox_id": b})
		return rec["state"] == "pausing", rec
	})
	restart()
	docker(t, "unpause", workflows.ContainerName(b))
	settles("pause_sandbox", "paused")
	require.Equal(t, "false", containerRunning(t, b))
	orphans := lcMust(t, g, "", "list_orphaned_sandboxes", nil)
	require.NotContains(t, fmt.Sprint(orphans["orphans"]), b, "a paused sandbox is no orphan")
	require.Equal(t, "accepted", lcMust(t, g, "", "resume_sandbox", map[string]any{"sandbox_id": b, "async": true})["status"])
	restart()
	settles("resume_sandbox", "ready")
	require.Equal(t, "true", containerRunning(t, b))
	got = lcMust(t, g, b, "file_read", map[string]any{"workspace_session_id": wsB, "path": "wip.txt"})
	require.Equal(t, "unpublished", got["content"], "the kept session survived the crashes")
	out := lcMust(t, g, b, "exec_command", map[string]any{"cmd": "cat wip.txt"})
	require.Equal(t, "ok", out["status"], "%v", out)
	require.Contains(t, fmt.Sprint(out["output"]), "unpublished")
}
