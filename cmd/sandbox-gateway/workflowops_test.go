package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// TestWorkflowsFromTheCLI: an --async publish answers at once; its result
// is fetched later with wait_operation; list_workflows filters by sandbox
// and status; describe_workflow shows one; cancel_operation refuses a
// sandbox's own workflow; bad ids are refused before any work.
func TestWorkflowsFromTheCLI(t *testing.T) {
	g, id, ws := gatewayWithSandbox(t, "base\n")
	rtc := func(argv ...string) map[string]any {
		t.Helper()
		return mustCLI(t, g, "sandbox-runtime-cli", append([]string{"--sandbox-id", id}, argv...)...)
	}
	s := rtc("create_workspace_session")["workspace_session_id"].(string)
	rtc("file_write", "--workspace-session-id", s, "--path", "n.txt", "--content", "new\n")

	acc := rtc("publish_workspace_session", "--workspace-session-id", s, "--async")
	require.Equal(t, "accepted", acc["status"], "%v", acc)
	wid, uid := acc["workflow_id"].(string), acc["update_id"].(string)
	res := mustCLI(t, g, mgr, "wait_operation", "--workflow-id", wid, "--update-id", uid)
	require.Equal(t, "completed", res["status"], "%v", res)
	pub := res["result"].(map[string]any)["publish"].(map[string]any)
	require.Equal(t, false, pub["no_op"], "%v", res)
	// Waiting again answers the same result.
	again := mustCLI(t, g, mgr, "wait_operation", "--workflow-id", wid, "--update-id", uid)
	require.Equal(t, res["result"], again["result"])

	list := mustCLI(t, g, mgr, "list_workflows", "--sandbox-id", id)["workflows"].([]any)
	var types []string
	var last map[string]any
	for _, w := range list {
		types = append(types, fmt.Sprint(w.(map[string]any)["type"]))
		if lp, ok := w.(map[string]any)["last_publish"].(map[string]any); ok {
			last = lp
		}
	}
	require.Contains(t, types, "eos.SandboxWorkflow")
	// The publish is one activity of the sandbox's workflow, recorded in its memo.
	require.NotNil(t, last, "the sandbox workflow lists its last publish: %v", list)
	require.Equal(t, "committed", last["outcome"], "%v", last)
	require.Equal(t, pub["layer_id"], last["layer_id"], "%v", last)
	// --limit reaches the gateway as a JSON number and bounds the list.
	other := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", ws)["id"].(string)
	cleanupSandbox(t, other)
	all := mustCLI(t, g, mgr, "list_workflows")["workflows"].([]any)
	require.Greater(t, len(all), 1, "%v", all)
	one := mustCLI(t, g, mgr, "list_workflows", "--limit", "1")["workflows"].([]any)
	require.Len(t, one, 1, "list_workflows --limit 1: %v", one)
	running := mustCLI(t, g, mgr, "list_workflows", "--sandbox-id", id, "--status", "running")["workflows"].([]any)
	require.Len(t, running, 1, "only the sandbox's own workflow runs: %v", running)

	d := mustCLI(t, g, mgr, "describe_workflow", "--workflow-id", "sandbox/"+id)
	require.Equal(t, "running", d["status"])
	require.Equal(t, "eos.SandboxWorkflow", d["type"])

	r := runCLI(t, g, mgr, "cancel_operation", "--workflow-id", "sandbox/"+id)
	require.Equal(t, 1, r.code)
	require.Equal(t, "invalid_request", r.errEnv["kind"])
	require.Contains(t, r.errEnv["message"], "destroy_sandbox")

	r = runCLI(t, g, mgr, "describe_workflow", "--workflow-id", "publish/nope/none/1")
	require.Equal(t, "not_found", r.errEnv["kind"], "%v", r.errEnv)
	for _, bad := range []string{"x' OR WorkflowId != '", "../../etc", strings.Repeat("a", 300)} {
		r = runCLI(t, g, mgr, "list_workflows", "--sandbox-id", bad)
		require.Equal(t, "invalid_request", r.errEnv["kind"], "%q: %v", bad, r.errEnv)
	}
	// An update id nobody sent: not found, said of the update, not the workflow.
	r = runCLI(t, g, mgr, "wait_operation", "--workflow-id", "sandbox/"+id, "--update-id", "never-sent")
	require.Equal(t, "not_found", r.errEnv["kind"], "%v", r.errEnv)
	require.Contains(t, r.errEnv["message"], "has no update never-sent", "%v", r.errEnv)
	r = runCLI(t, g, mgr, "wait_operation", "--workflow-id", "sandbox/"+id, "--update-id", "../../etc")
	require.Equal(t, "invalid_request", r.errEnv["kind"], "%v", r.errEnv)
	// A rejected async publish: wait_operation answers the same refusal.
	a := rtc("create_workspace_session")["workspace_session_id"].(string)
	b := rtc("create_workspace_session")["workspace_session_id"].(string)
	rtc("file_write", "--workspace-session-id", a, "--path", "f.txt", "--content", "A\n")
	rtc("file_write", "--workspace-session-id", b, "--path", "f.txt", "--content", "B\n")
	rtc("publish_workspace_session", "--workspace-session-id", a)
	acc = rtc("publish_workspace_session", "--workspace-session-id", b, "--async")
	r = runCLI(t, g, mgr, "wait_operation", "--workflow-id", acc["workflow_id"].(string), "--update-id", acc["update_id"].(string))
	require.Equal(t, 1, r.code)
	require.Equal(t, "operation_failed", r.errEnv["kind"])
	require.Contains(t, r.errEnv["details"], "conflicts")

	// The git-style patch export, reachable from the CLI.
	patch := filepath.Join(t.TempDir(), "changes.patch")
	ex := mustCLI(t, g, mgr, "export_changes", "--sandbox-id", id, "--dest", patch, "--format", "patch")
	require.Equal(t, "patch", ex["format"], "%v", ex)
	b2, err := os.ReadFile(patch)
	require.NoError(t, err)
	require.Contains(t, string(b2), "diff --git a/n.txt b/n.txt")
}
