package main

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
)

// TestViewsOfABusySandboxReadTheirWrites: the views of a sandbox whose
// workflow is busy read the copy of its state that the sandbox workflow
// keeps in the gateway's process, and read their writes (busyViews); then
// a pause and a resume show in the next read after their answers. The
// real stack: gateway, embedded Temporal, worker, Docker, daemon.
func TestViewsOfABusySandboxReadTheirWrites(t *testing.T) {
	g, id, _ := gatewayWithSandbox(t, "base\n")
	call := busyViews(t, g, id, "copy", "copy_after_wait")

	// A pause and a resume show in the read right after their answers.
	_, err := call("pause_sandbox", nil)
	require.NoError(t, err)
	m, err := call("inspect_sandbox", nil)
	require.NoError(t, err)
	require.Equal(t, "paused", m["state"], "%v", m)
	_, err = call("resume_sandbox", nil)
	require.NoError(t, err)
	m, err = call("inspect_sandbox", nil)
	require.NoError(t, err)
	require.Equal(t, "ready", m["state"], "%v", m)
}

// busyViews reads the views of sandbox id on gateway g (inspect_sandbox
// and list_sandboxes) while four agents create sessions, publish and
// destroy them side by side, and checks that no read shows less than was
// answered before it was sent, nor more than was sent before it was
// answered: every publish answered counts in activity_revision; every
// session whose create was answered and that no publish or destroy was
// sent for counts in workspace_session_count. The load goes on until 60
// reads were made, 40 sessions went, and 5 reads came from the sources
// named (eos_sandbox_view_reads_total: the workflow's copy, not its
// query). Once quiet, a read names exactly what was answered. It returns
// the call it made ops with.
func busyViews(t *testing.T, g *gatewayProc, id string, sources ...string) func(string, map[string]any) (map[string]any, error) {
	t.Helper()

	call := func(name string, args map[string]any) (map[string]any, error) {
		scope := map[string]any{"kind": "sandbox", "sandbox_id": id}
		if o, _ := api.LookupOp(name); o.Scope == api.ScopeSystem {
			scope = map[string]any{"kind": "system"}
			if name != "list_sandboxes" {
				args = map[string]any{"sandbox_id": id}
			}
		}
		_, b, err := g.HTTPOp(name, map[string]any{"scope": scope, "args": args, "request_id": "views-" + client.NewRequestID()[:12]})
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: %s", name, b)
		}
		if e, ok := m["error"]; ok {
			return nil, fmt.Errorf("%s: %v", name, e)
		}
		return m, nil
	}
	// What the agents sent and were answered, counted before a send and
	// after an answer.
	var createsSent, createsAnswered, removalsSent, removalsAnswered, publishesSent, publishesAnswered atomic.Int64
	// What the sandbox had before (quiet): the counts start from there.
	m0, err := call("inspect_sandbox", nil)
	require.NoError(t, err)
	baseSessions, basePublishes := int64(m0["workspace_session_count"].(float64)), int64(m0["activity_revision"].(float64))
	copies := func() float64 {
		n := 0.0
		for _, src := range sources {
			n += metricValue(t, g, `eos_sandbox_view_reads_total{source="`+src+`"}`)
		}
		return n
	}

	stop := make(chan struct{})
	var agents sync.WaitGroup
	errs := make(chan error, 16)
	for a := 0; a < 4; a++ {
		agents.Add(1)
		go func(a int) {
			defer agents.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				createsSent.Add(1)
				m, err := call("create_workspace_session", nil)
				if err != nil {
					errs <- err
					return
				}
				createsAnswered.Add(1)
				s := m["workspace_session_id"]
				removalsSent.Add(1)
				if i%2 == 0 {
					_, err = call("destroy_workspace_session", map[string]any{"workspace_session_id": s})
				} else if _, err = call("file_write", map[string]any{"workspace_session_id": s, "path": fmt.Sprintf("a%d-%d.txt", a, i), "content": "x"}); err == nil {
					publishesSent.Add(1)
					if _, err = call("publish_workspace_session", map[string]any{"workspace_session_id": s}); err == nil {
						publishesAnswered.Add(1)
					}
				}
				if err != nil {
					errs <- err
					return
				}
				removalsAnswered.Add(1)
			}
		}(a)
	}
	defer func() { close(stop); agents.Wait() }()

	// One read, checked against the counts around it.
	read := func(view string) {
		t.Helper()
		// At least: the creates and publishes answered before the read was
		// sent, less every removal sent before it was answered. At most:
		// what was sent before it was answered, less the removals answered
		// before it was sent.
		created, removed, published := createsAnswered.Load(), removalsAnswered.Load(), publishesAnswered.Load()
		m, err := call(view, nil)
		require.NoError(t, err)
		lowSessions, highSessions := baseSessions+created-removalsSent.Load(), baseSessions+createsSent.Load()-removed
		lowPublishes, highPublishes := basePublishes+published, basePublishes+publishesSent.Load()
		rec := m
		if view == "list_sandboxes" {
			rec = nil
			for _, r := range m["sandboxes"].([]any) {
				if r.(map[string]any)["id"] == id {
					rec = r.(map[string]any)
				}
			}
			require.NotNil(t, rec, "list_sandboxes lists %s: %v", id, m)
		}
		require.Equal(t, "ready", rec["state"], "%s: %v", view, rec)
		sessions, publishes := int64(rec["workspace_session_count"].(float64)), int64(rec["activity_revision"].(float64))
		require.GreaterOrEqual(t, sessions, lowSessions, "%s shows fewer sessions than were created and not removed before it was sent", view)
		require.LessOrEqual(t, sessions, highSessions, "%s shows more sessions than were created and not removed", view)
		require.GreaterOrEqual(t, publishes, lowPublishes, "%s shows fewer publishes than were answered before it was sent", view)
		require.LessOrEqual(t, publishes, highPublishes, "%s shows more publishes than were sent", view)
	}
	before := copies()
	deadline := time.Now().Add(3 * time.Minute)
	reads := 0
	for ; reads < 60 || removalsAnswered.Load() < 40 || copies() < before+5; reads++ {
		require.True(t, time.Now().Before(deadline), "after %d reads of a busy sandbox, %v of them read the workflow's copy (want 5)", reads, copies()-before)
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		read([]string{"inspect_sandbox", "list_sandboxes"}[reads%2])
	}
	close(stop)
	agents.Wait()
	stop = make(chan struct{})
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	require.Positive(t, publishesAnswered.Load())
	t.Logf("%d reads, %v from the workflow's copy; %d creates, %d publishes", reads, copies()-before, createsAnswered.Load(), publishesAnswered.Load())

	// Quiet now: each read names exactly what was answered.
	for _, view := range []string{"inspect_sandbox", "list_sandboxes"} {
		read(view)
	}
	m, err := call("inspect_sandbox", nil)
	require.NoError(t, err)
	require.EqualValues(t, baseSessions, m["workspace_session_count"])
	require.EqualValues(t, basePublishes+publishesAnswered.Load(), m["activity_revision"])
	return call
}
