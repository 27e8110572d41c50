package workflows

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
)

func mirroredRaw(t *testing.T, id string) (*mirrored, *SandboxState) {
	t.Helper()
	v, ok := mirror.Load(id)
	if !ok {
		return nil, nil
	}
	m := v.(*mirrored)
	var st SandboxState
	require.NoError(t, json.Unmarshal(m.state, &st))
	return m, &st
}

// The sandbox workflow leaves its state in the mirror once an update
// handler waits on its daemon call: the state the handler started from (no
// session yet while the first create's call runs; the first's session
// while the second's runs).
func TestSandboxMirrorsItsState(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	id := "default-test-workflow-id"
	ForgetMirrored(id)
	t.Cleanup(func() { ForgetMirrored(id) })
	var during []*SandboxState
	creates := 0
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		if call.Op == "create_workspace_session" {
			m, st := mirroredRaw(t, id)
			require.NotNil(t, m, "mirrored before the daemon call")
			require.NotEmpty(t, m.runID)
			during = append(during, st)
			creates++
			return json.RawMessage(fmt.Sprintf(`{"workspace_session_id":"ws-%d","network_profile":"shared"}`, creates)), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Maybe()
	e.script(time.Second,
		step{name: UpdateWaitReady, check: ok(t)},
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{Agent: "a"}}, check: ok(t)},
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{Agent: "b"}}, check: ok(t)},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.Len(t, during, 2)
	require.Equal(t, PhaseReady, during[0].Phase)
	require.Empty(t, during[0].Sessions, "the state the first create started from")
	require.Contains(t, during[1].Sessions, "ws-1", "the state the second create started from")
	require.NotContains(t, during[1].Sessions, "ws-2")
	require.False(t, HasMirrored(id), "the run ended: its copy is gone")
}

// MirroredState answers only for the run it was left by, and only while the
// history it is checked against has no event the copy has not seen.
func TestMirroredStateFreshness(t *testing.T) {
	id := "sandbox/mirror-test"
	t.Cleanup(func() { ForgetMirrored(id) })
	_, ok := MirroredState(id, "run-1", 10)
	require.False(t, ok, "nothing left")
	require.NoError(t, Mirror(id, "run-1", 10, &SandboxState{SandboxID: "mirror-test", Phase: PhaseReady, Publishes: 3}))
	st, ok := MirroredState(id, "run-1", 10)
	require.True(t, ok)
	require.Equal(t, 3, st.Publishes)
	_, ok = MirroredState(id, "run-1", 8)
	require.True(t, ok, "a history the server has not written all of yet (the task still open)")
	_, ok = MirroredState(id, "run-1", 11)
	require.False(t, ok, "an event the copy has not seen")
	_, ok = MirroredState(id, "run-2", 10)
	require.False(t, ok, "another run")
	_, ok = MirroredState(id, "", 10)
	require.False(t, ok)
	_, ok = MirroredState(id, "run-1", 0)
	require.False(t, ok, "no history length to check against")
	ForgetMirrored(id)
	_, ok = MirroredState(id, "run-1", 10)
	require.False(t, ok)
}

// The run's last publish is copied with its state and read under the same
// condition: none yet is nil, a recorded one comes back as recorded.
func TestMirroredLastPublish(t *testing.T) {
	id := "sandbox/mirror-last"
	t.Cleanup(func() { ForgetMirrored(id) })
	require.NoError(t, mirrorRecords(id, "run-1", 10, &SandboxState{SandboxID: "mirror-last"}, nil))
	rec, ok := MirroredLastPublish(id, "run-1", 10)
	require.True(t, ok)
	require.Nil(t, rec, "no publish in this run yet")
	at := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	require.NoError(t, mirrorRecords(id, "run-1", 12, &SandboxState{SandboxID: "mirror-last", Publishes: 4},
		&PublishRecord{TxID: "tx-4", Outcome: "committed", Publishes: 4, At: at}))
	rec, ok = MirroredLastPublish(id, "run-1", 12)
	require.True(t, ok)
	require.Equal(t, "tx-4", rec.TxID)
	require.Equal(t, at, rec.At)
	_, ok = MirroredLastPublish(id, "run-1", 13)
	require.False(t, ok, "an event the copy has not seen")
	_, ok = MirroredLastPublish(id, "run-2", 12)
	require.False(t, ok, "another run")

	// What a host's forwarder serves: both, under the same condition.
	b, ok := MirroredCopyJSON(id, "run-1", 12)
	require.True(t, ok)
	var c struct {
		State       SandboxState   `json:"state"`
		LastPublish *PublishRecord `json:"last_publish"`
	}
	require.NoError(t, json.Unmarshal(b, &c))
	require.Equal(t, 4, c.State.Publishes)
	require.Equal(t, "tx-4", c.LastPublish.TxID)
	_, ok = MirroredCopyJSON(id, "run-1", 13)
	require.False(t, ok)
}

// BenchmarkMirror: what one copy of a sandbox's state costs with 50
// sessions (the sandbox workflow makes one per batch of updates a task
// starts).
func BenchmarkMirror(b *testing.B) {
	st := &SandboxState{SandboxID: "bench", Phase: PhaseReady, Sessions: map[string]*SessionRecord{}, Created: time.Now()}
	for i := 0; i < 50; i++ {
		id := fmt.Sprintf("ws-%012d", i)
		st.Sessions[id] = &SessionRecord{ID: id, NetworkProfile: "shared", Agent: fmt.Sprintf("agent-%02d", i), Created: time.Now()}
	}
	b.Cleanup(func() { ForgetMirrored("sandbox/bench") })
	b.ReportAllocs()
	for b.Loop() {
		if err := Mirror("sandbox/bench", "run", 100, st); err != nil {
			b.Fatal(err)
		}
	}
}
