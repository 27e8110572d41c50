package worker

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestRecordHistories records the workflow histories that
// workflows/replay_test.go replays, by driving real workflows through the
// embedded Temporal, real Docker and the real daemon. It runs only when asked:
//
//	EOS_RECORD_HISTORIES=1 go test -count=1 -run '^TestRecordHistories$' ./worker/
//
// Re-record only to add a scenario. A history recorded by older workflow
// code is the point of the replay test: if a change to workflows/ breaks an
// existing history, that change needs workflow.GetVersion, not a new
// recording.
func TestRecordHistories(t *testing.T) {
	if os.Getenv("EOS_RECORD_HISTORIES") != "1" {
		return
	}
	s := startStack(t)
	out := filepath.Join(testenv.RepoRoot(), "workflows", "testdata")
	require.NoError(t, os.MkdirAll(out, 0o755))

	t.Run("lifecycle", func(t *testing.T) {
		// Two sessions edit the same line: the first publishes cleanly, the
		// second conflicts with the new head.
		id, ep := s.recordCreate(t)
		var sess []string
		for i := 0; i < 2; i++ {
			var o map[string]any
			require.NoError(t, s.update(id, workflows.UpdateCreateSession, &o, workflows.CreateSessionRequest{Agent: fmt.Sprintf("agent-%d", i)}))
			sess = append(sess, o["workspace_session_id"].(string))
		}
		for i, script := range []string{"sed -i 's/^line 2$/LINE TWO/' f.txt", "sed -i 's/^line 2$/line deux/' f.txt"} {
			o := s.daemon(id, ep, "exec_command", map[string]any{"cmd": script, "workspace_session_id": sess[i], "yield_time_ms": 30000})
			require.Equal(t, "ok", o["status"])
		}
		var pub map[string]any
		require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[0], Message: "clean"}))
		err := s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[1], Message: "conflicting"})
		require.ErrorContains(t, err, "publish rejected")
		var final workflows.SandboxState
		require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
		s.waitClosed(t, workflows.SandboxWorkflowID(id))

		s.saveHistory(t, id, workflows.SandboxWorkflowID(id), filepath.Join(out, "sandbox-lifecycle.json"))
		s.saveHistory(t, id, workflows.PublishWorkflowID(id, sess[0], 1), filepath.Join(out, "publish-clean.json"))
		s.saveHistory(t, id, workflows.PublishWorkflowID(id, sess[1], 2), filepath.Join(out, "publish-conflict.json"))
	})

	t.Run("create-failed", func(t *testing.T) {
		// The workspace to copy is missing: CopyWorkspace fails after the
		// volume and the container exist, so the saga compensates.
		id := "rec-" + randHex(6)
		t.Cleanup(func() { _ = s.acts.RemoveSandbox(context.Background(), id) })
		ctx := context.Background()
		run, err := s.svc.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
			workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue,
				Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: "/nonexistent/workspace"}})
		require.NoError(t, err)
		require.Error(t, run.Get(ctx, nil))
		h := s.history(t, workflows.SandboxWorkflowID(id))
		require.Contains(t, scheduledActivities(h), "RemoveSandbox", "the failed create was compensated")
		s.writeHistory(t, h, id, filepath.Join(out, "sandbox-create-failed.json"))
	})

	t.Run("create-streamed", func(t *testing.T) {
		// A create whose workspace is streamed to the started daemon
		// (versionStreamedImport), a session, destroy.
		id, _ := s.recordCreate(t)
		var o map[string]any
		require.NoError(t, s.update(id, workflows.UpdateCreateSession, &o, workflows.CreateSessionRequest{Agent: "streamed"}))
		var final workflows.SandboxState
		require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
		s.waitClosed(t, workflows.SandboxWorkflowID(id))
		h := s.history(t, workflows.SandboxWorkflowID(id))
		acts := scheduledActivities(h)
		require.Contains(t, acts, "ImportWorkspace")
		require.NotContains(t, acts, "CopyWorkspace")
		s.writeHistory(t, h, id, filepath.Join(out, "sandbox-create-streamed.json"))
	})

	t.Run("create-streamed-failed", func(t *testing.T) {
		// The workspace is missing: the streamed import fails after the
		// container runs, so the saga compensates.
		id := "rec-" + randHex(6)
		t.Cleanup(func() { _ = s.acts.RemoveSandbox(context.Background(), id) })
		ctx := context.Background()
		run, err := s.svc.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
			workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue,
				Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: "/nonexistent/workspace"}})
		require.NoError(t, err)
		require.Error(t, run.Get(ctx, nil))
		h := s.history(t, workflows.SandboxWorkflowID(id))
		acts := scheduledActivities(h)
		require.Contains(t, acts, "ImportWorkspace")
		require.Contains(t, acts, "RemoveSandbox", "the failed create was compensated")
		s.writeHistory(t, h, id, filepath.Join(out, "sandbox-create-streamed-failed.json"))
	})

	t.Run("contended", func(t *testing.T) { recordContended(t, s, out) })

	t.Run("publish-keep", func(t *testing.T) {
		id, ep := s.recordCreate(t)
		var o map[string]any
		require.NoError(t, s.update(id, workflows.UpdateCreateSession, &o, workflows.CreateSessionRequest{Agent: "keeper"}))
		sess := o["workspace_session_id"].(string)
		r := s.daemon(id, ep, "exec_command", map[string]any{"cmd": "sed -i 's/^line 5$/LINE FIVE/' f.txt", "workspace_session_id": sess, "yield_time_ms": 30000})
		require.Equal(t, "ok", r["status"])
		var pub map[string]any
		require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess, Keep: true, Message: "keep"}))
		var st workflows.SandboxState
		require.NoError(t, s.update(id, workflows.UpdateWaitReady, &st))
		require.Contains(t, st.Sessions, sess, "keep retains the session")
		var final workflows.SandboxState
		require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
		s.waitClosed(t, workflows.SandboxWorkflowID(id))

		s.saveHistory(t, id, workflows.SandboxWorkflowID(id), filepath.Join(out, "sandbox-publish-keep.json"))
		s.saveHistory(t, id, workflows.PublishWorkflowID(id, sess, 1), filepath.Join(out, "publish-keep.json"))
	})

	t.Run("publish-one-activity", func(t *testing.T) {
		// Publishes as one exactly-once activity: a clean one, a
		// conflicting one, a kept one, a verified one that passes and one
		// that fails (recorded with versionPublishOneActivity).
		id, ep := s.recordCreate(t)
		var sess []string
		for i := 0; i < 5; i++ {
			var o map[string]any
			require.NoError(t, s.update(id, workflows.UpdateCreateSession, &o, workflows.CreateSessionRequest{Agent: fmt.Sprintf("agent-%d", i)}))
			sess = append(sess, o["workspace_session_id"].(string))
		}
		for i, script := range []string{"sed -i 's/^line 2$/LINE TWO/' f.txt", "sed -i 's/^line 2$/line deux/' f.txt",
			"sed -i 's/^line 5$/LINE FIVE/' f.txt", "echo ok > v.txt", "echo bad > w.txt"} {
			o := s.daemon(id, ep, "exec_command", map[string]any{"cmd": script, "workspace_session_id": sess[i], "yield_time_ms": 30000})
			require.Equal(t, "ok", o["status"])
		}
		var pub map[string]any
		require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[0], Message: "clean"}))
		require.ErrorContains(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[1]}), "publish rejected")
		require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[2], Keep: true}))
		pass, fail := "test -f v.txt", "cat w.txt; exit 3"
		require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[3], Verify: &pass}))
		require.ErrorContains(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[4], Verify: &fail}), "exited 3")
		var final workflows.SandboxState
		require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
		s.waitClosed(t, workflows.SandboxWorkflowID(id))
		h := s.history(t, workflows.SandboxWorkflowID(id))
		require.NotContains(t, scheduledActivities(h), "PublishWorkflow")
		s.writeHistory(t, h, id, filepath.Join(out, "sandbox-publish-one-activity.json"))
	})

	t.Run("lifecycle-ttl", func(t *testing.T) { recordLifecycleTTL(t, s, out) })

	t.Run("publish-settles", func(t *testing.T) {
		// A publish refused at prepare (a command still runs) is aborted;
		// after the command is cancelled the next one commits (recorded
		// with versionPublishSettles, so the replay test keeps its path).
		id, ep := s.recordCreate(t)
		var o map[string]any
		require.NoError(t, s.update(id, workflows.UpdateCreateSession, &o, workflows.CreateSessionRequest{Agent: "settler"}))
		sess := o["workspace_session_id"].(string)
		r := s.daemon(id, ep, "exec_command", map[string]any{"cmd": "echo x > x.txt; sleep 60", "workspace_session_id": sess, "yield_time_ms": 500})
		require.Equal(t, "running", r["status"])
		var pub map[string]any
		require.ErrorContains(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess}), "running command")
		s.daemon(id, ep, "cancel_command", map[string]any{"command_session_id": r["command_session_id"]})
		require.NoError(t, s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess, Message: "settled"}))
		var final workflows.SandboxState
		require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
		s.waitClosed(t, workflows.SandboxWorkflowID(id))

		h := s.history(t, workflows.PublishWorkflowID(id, sess, 1))
		require.Equal(t, []string{"CallDaemon", "CallDaemon"}, scheduledActivities(h), "prepare, then the abort")
		s.saveHistory(t, id, workflows.SandboxWorkflowID(id), filepath.Join(out, "sandbox-publish-settles.json"))
		s.writeHistory(t, h, id, filepath.Join(out, "publish-prepare-refused.json"))
		s.saveHistory(t, id, workflows.PublishWorkflowID(id, sess, 2), filepath.Join(out, "publish-settled.json"))
	})
}

// lifecycle-ttl: an idle session archived and restored, a user pause and
// resume (and an idempotent second pause), then the TTL's pause, then
// destroy.
func recordLifecycleTTL(t *testing.T, s *stack, out string) {
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte("line 1\n"), 0o644))
	id := "rec-" + randHex(6)
	t.Cleanup(func() { _ = s.acts.RemoveSandbox(context.Background(), id) })
	_, err := s.svc.Client.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
		workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue, SessionTTL: 2 * time.Second, SandboxTTL: 30 * time.Second,
			Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: ws}})
	require.NoError(t, err)
	var st workflows.SandboxState
	require.NoError(t, s.update(id, workflows.UpdateWaitReady, &st))
	var o map[string]any
	require.NoError(t, s.update(id, workflows.UpdateCreateSession, &o, workflows.CreateSessionRequest{Agent: "idler"}))
	sess := o["workspace_session_id"].(string)
	s.daemon(id, st.Container.Daemon, "file_write", map[string]any{"workspace_session_id": sess, "path": "idle.txt", "content": "kept"})
	require.Eventually(t, func() bool { _, live := s.state(id).Sessions[sess]; return !live }, time.Minute, 200*time.Millisecond, "archived")
	var r map[string]any
	require.NoError(t, s.update(id, workflows.UpdateRestoreSession, &r, workflows.SessionRequest{WorkspaceSessionID: sess}))
	var lr workflows.LifecycleResult
	require.NoError(t, s.update(id, workflows.UpdatePause, &lr))
	require.NoError(t, s.update(id, workflows.UpdatePause, &lr))
	require.True(t, lr.Already)
	require.NoError(t, s.update(id, workflows.UpdateResume, &lr))
	require.Eventually(t, func() bool {
		st := s.state(id)
		return st.Phase == workflows.PhasePaused && st.Lifecycle.PausedBy == workflows.PausedByTTL
	},
		2*time.Minute, 200*time.Millisecond, "the ttl pauses")
	var final workflows.SandboxState
	require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
	s.waitClosed(t, workflows.SandboxWorkflowID(id))
	s.saveHistory(t, id, workflows.SandboxWorkflowID(id), filepath.Join(out, "sandbox-lifecycle-ttl.json"))
}

// contended: publishes of two sessions sent at once, and a refresh of a
// third meanwhile (recorded with the code that ran them one at a time under
// the workflow's commit mutex, so the replay test keeps that code path).
func recordContended(t *testing.T, s *stack, out string) {
	id, ep := s.recordCreate(t)
	var sess []string
	for i := 0; i < 3; i++ {
		var o map[string]any
		require.NoError(t, s.update(id, workflows.UpdateCreateSession, &o, workflows.CreateSessionRequest{Agent: fmt.Sprintf("contender-%d", i)}))
		sess = append(sess, o["workspace_session_id"].(string))
	}
	for i, script := range []string{"sed -i 's/^line 1$/LINE ONE/' f.txt", "sed -i 's/^line 9$/LINE NINE/' f.txt", "echo new > n.txt"} {
		o := s.daemon(id, ep, "exec_command", map[string]any{"cmd": script, "workspace_session_id": sess[i], "yield_time_ms": 30000})
		require.Equal(t, "ok", o["status"])
	}
	errs := make(chan error, 3)
	for i := 0; i < 2; i++ {
		go func(i int) {
			var pub map[string]any
			errs <- s.update(id, workflows.UpdatePublish, &pub, workflows.PublishRequest{WorkspaceSessionID: sess[i], Message: "contended"})
		}(i)
	}
	go func() {
		var r map[string]any
		errs <- s.update(id, workflows.UpdateRefresh, &r, workflows.SessionRequest{WorkspaceSessionID: sess[2]})
	}()
	for i := 0; i < 3; i++ {
		require.NoError(t, <-errs)
	}
	var final workflows.SandboxState
	require.NoError(t, s.update(id, workflows.UpdateDestroy, &final))
	s.waitClosed(t, workflows.SandboxWorkflowID(id))
	s.saveHistory(t, id, workflows.SandboxWorkflowID(id), filepath.Join(out, "sandbox-contended.json"))
}

// recordCreate creates a ready sandbox over a fresh ten-line workspace.
func (s *stack) recordCreate(t *testing.T) (string, api.Endpoint) {
	t.Helper()
	ws := t.TempDir()
	var b strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte(b.String()), 0o644))
	id, st := s.create(ws)
	require.Equal(t, workflows.PhaseReady, st.Phase)
	return id, st.Container.Daemon
}

// waitClosed waits for the workflow's run to finish, so its history is
// complete.
func (s *stack) waitClosed(t *testing.T, workflowID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.svc.Client.GetWorkflow(ctx, workflowID, "").Get(ctx, nil))
}

func (s *stack) history(t *testing.T, workflowID string) *historypb.History {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	it := s.svc.Client.GetWorkflowHistory(ctx, workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	h := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		h.Events = append(h.Events, ev)
	}
	require.NotEmpty(t, h.Events, workflowID)
	return h
}

func (s *stack) saveHistory(t *testing.T, sandboxID, workflowID, path string) {
	t.Helper()
	s.writeHistory(t, s.history(t, workflowID), sandboxID, path)
}

// writeHistory writes h as protojson, the format
// WorkflowReplayer.ReplayWorkflowHistoryFromJSONFile reads (and
// `temporal workflow show --output json` writes).
func (s *stack) writeHistory(t *testing.T, h *historypb.History, sandboxID, path string) {
	t.Helper()
	last := h.Events[len(h.Events)-1].GetEventType()
	require.Contains(t, []enumspb.EventType{
		enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
	}, last, "%s: the history must be of a closed run", path)
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(h)
	require.NoError(t, err)
	// Histories are committed: they must hold nothing that opens a daemon.
	for _, secret := range []string{hex.EncodeToString(s.secret), daemonclient.Token(s.secret, sandboxID)} {
		require.NotContains(t, string(b), secret, path)
	}
	require.NoError(t, os.WriteFile(path, append(b, '\n'), 0o644))
	t.Logf("wrote %s: %d events, ends with %s", path, len(h.Events), last)
}

func scheduledActivities(h *historypb.History) []string {
	var names []string
	for _, ev := range h.Events {
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			names = append(names, a.GetActivityType().GetName())
		}
	}
	return names
}
