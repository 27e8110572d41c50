package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

func (e *env) state() SandboxState {
	e.t.Helper()
	v, err := e.QueryWorkflow(QueryState)
	require.NoError(e.t, err)
	var st SandboxState
	require.NoError(e.t, v.Get(&st))
	return st
}

// createSteps mocks the creation steps before the container starts.
func (e *env) createSteps() {
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(nil)
	e.OnActivity(acts.CreateContainer, mock.Anything, createSpec).Return(ContainerInfo{Name: "eos-sbx-sb1"}, nil)
	e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, nil)
}

func kindOf(t *testing.T, err error) *api.Error {
	t.Helper()
	require.Error(t, err)
	ae, ok := apperr.From(err)
	require.True(t, ok, "not an api error: %v", err)
	return ae
}

// TestTTLPausesNeverDeletes: past its TTL the sandbox is paused by the
// workflow's timer (container stopped, nothing removed); runtime updates
// are refused with failed_precondition and a hint; pause and resume are
// idempotent; a resume re-arms the TTL from the resume, and the timer
// pauses it again; a paused sandbox can be destroyed.
func TestTTLPausesNeverDeletes(t *testing.T) {
	e := newEnv(t)
	e.createSteps()
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil)
	e.daemon(okDaemon)
	stops, removes := 0, 0
	e.OnActivity(acts.StopContainer, mock.Anything, "sb1").Return(func(context.Context, string) error { stops++; return nil })
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(func(context.Context, string) error { removes++; return nil })
	resumedEP := api.Endpoint{Host: "127.0.0.1", Port: 40002}
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: daemonEP, State: "running"}, nil).Once()
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: resumedEP, State: "running"}, nil)
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", resumedEP).Return(nil)

	e.RegisterDelayedCallback(func() {
		st := e.state()
		require.Equal(t, PhaseReady, st.Phase)
		require.NotNil(t, st.Lifecycle)
		require.Equal(t, time.Hour, st.Lifecycle.TTL)
		require.Equal(t, 10*time.Minute, st.Lifecycle.SessionIdleTTL)
		require.NotNil(t, st.Lifecycle.ExpiresAt)
		require.Equal(t, st.Created.Add(time.Hour), *st.Lifecycle.ExpiresAt)
	}, 30*time.Minute)
	e.RegisterDelayedCallback(func() {
		st := e.state()
		require.Equal(t, PhasePaused, st.Phase, "past its ttl the sandbox is paused")
		require.Equal(t, PausedByTTL, st.Lifecycle.PausedBy)
		require.Equal(t, 1, stops)
		require.Equal(t, 0, removes, "a ttl never deletes")
	}, 90*time.Minute)
	e.script(100*time.Minute,
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: func(_ json.RawMessage, err error) {
			ae := kindOf(t, err)
			require.Equal(t, api.KindFailedPrecondition, ae.Kind)
			require.Equal(t, "resume_sandbox", ae.Details["hint"])
		}},
		step{name: UpdateResolveDaemon, check: func(_ json.RawMessage, err error) {
			require.Equal(t, api.KindFailedPrecondition, kindOf(t, err).Kind)
		}},
		step{name: UpdatePause, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			var r LifecycleResult
			require.NoError(t, json.Unmarshal(out, &r))
			require.True(t, r.Already)
			require.Equal(t, PhasePaused, r.State)
		}, then: func() { require.Equal(t, 1, stops, "pausing a paused sandbox stops nothing") }},
		step{name: UpdateResume, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			var r LifecycleResult
			require.NoError(t, json.Unmarshal(out, &r))
			require.False(t, r.Already)
			require.Equal(t, PhaseReady, r.State)
			require.Equal(t, resumedEP, *r.Daemon, "the daemon's new endpoint is recorded")
		}, then: func() {
			st := e.state()
			require.Equal(t, resumedEP, st.Container.Daemon)
			require.NotNil(t, st.Lifecycle.ResumedAt)
			require.Equal(t, st.Lifecycle.ResumedAt.Add(time.Hour), *st.Lifecycle.ExpiresAt)
			require.Empty(t, st.Lifecycle.PausedBy)
		}},
		step{name: UpdateResume, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			require.Contains(t, string(out), `"already":true`)
		}},
	)
	e.RegisterDelayedCallback(func() {
		st := e.state()
		require.Equal(t, PhasePaused, st.Phase, "the resumed sandbox's ttl ran out again")
		require.Equal(t, 2, stops)
		require.Equal(t, 2, st.Lifecycle.Pauses)
	}, 200*time.Minute)
	e.script(210*time.Minute, step{name: UpdateDestroy, check: ok(t)})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, SandboxTTL: time.Hour, SessionTTL: 10 * time.Minute})
	require.NoError(t, e.GetWorkflowError())
	var res SandboxResult
	require.NoError(t, e.GetWorkflowResult(&res))
	require.Equal(t, PhaseStopped, res.Phase)
	require.Equal(t, 1, removes, "destroy removes a paused sandbox")
}

// TestPauseWithoutTTLAndFailedResume: a user pause of a sandbox without a
// TTL; a resume whose daemon never gets ready stops the container again
// and leaves the sandbox paused (never half-running), and a later resume
// works.
func TestPauseWithoutTTLAndFailedResume(t *testing.T) {
	e := newEnv(t)
	e.createSteps()
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: daemonEP, State: "running"}, nil)
	e.daemon(okDaemon)
	stops := 0
	e.OnActivity(acts.StopContainer, mock.Anything, "sb1").Return(func(context.Context, string) error { stops++; return nil })
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil).Once()
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(apperr.Newf(api.KindOperationFailed, nil, "never ready")).Once()
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil)
	e.script(time.Minute,
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)},
		step{name: UpdatePause, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			require.Contains(t, string(out), `"paused_by":"user"`)
		}},
		step{name: UpdateResume, check: func(_ json.RawMessage, err error) {
			require.Error(t, err)
		}, then: func() {
			require.Equal(t, PhasePaused, e.state().Phase)
			require.Equal(t, 2, stops, "the failed resume stopped what it started")
			require.Contains(t, e.state().Sessions, "ws-1", "sessions are kept")
		}},
		step{name: UpdateResume, check: ok(t), then: func() { require.Equal(t, PhaseReady, e.state().Phase) }},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
}

// TestBadTTLCreatesNothing: durations out of bounds fail creation with
// invalid_request before any Docker object is made.
func TestBadTTLCreatesNothing(t *testing.T) {
	for _, in := range []SandboxInput{{Spec: spec, SandboxTTL: -time.Second}, {Spec: spec, SessionTTL: time.Millisecond},
		{Spec: spec, SandboxTTL: 400 * 24 * time.Hour}} {
		e := newEnv(t)
		e.ExecuteWorkflow(SandboxWorkflowName, in)
		err := e.GetWorkflowError()
		var app *temporal.ApplicationError
		require.True(t, errors.As(err, &app), "%v", err)
		require.Equal(t, api.KindInvalidRequest, app.Type())
		e.AssertNotCalled(t, "CheckImage", mock.Anything, mock.Anything)
	}
}

// TestRestoreArchivedSession: an idle-archived session leaves the
// sandbox's sessions; restore brings it back; restoring an active one is
// refused before any daemon call.
func TestRestoreArchivedSession(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	restores, archives := 0, 0
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		switch call.Op {
		case "archive_idle_sessions":
			// The daemon archives ws-1 once; reaps after its restore (the
			// test environment skips time, so they may come between any
			// two steps) find nothing idle, as a real daemon's would.
			if archives++; archives > 1 {
				return json.RawMessage(`{"archived":[]}`), nil
			}
			return json.RawMessage(`{"archived":[{"workspace_session_id":"ws-1","path":"/eos/archive/ws-1","files_changed":1}]}`), nil
		case "restore_workspace_session":
			restores++
			return json.RawMessage(`{"workspace_session_id":"ws-1","state":"active","network_profile":"shared","files_changed":1}`), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(time.Second, step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)})
	e.script(2*time.Hour,
		step{name: UpdateRestoreSession, args: []any{SessionRequest{WorkspaceSessionID: "../x"}}, check: func(_ json.RawMessage, err error) {
			require.Equal(t, api.KindInvalidRequest, kindOf(t, err).Kind)
		}},
		step{name: UpdateRestoreSession, args: []any{SessionRequest{WorkspaceSessionID: "ws-1"}}, check: ok(t), then: func() {
			st := e.state()
			require.Contains(t, st.Sessions, "ws-1")
			require.Empty(t, st.Archived)
		}},
		step{name: UpdateRestoreSession, args: []any{SessionRequest{WorkspaceSessionID: "ws-1"}}, check: func(_ json.RawMessage, err error) {
			require.Equal(t, api.KindFailedPrecondition, kindOf(t, err).Kind)
		}},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, SessionTTL: time.Hour})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, 1, restores)
}

// TestPauseRefusedWhilePublishing: the validator names the publishing
// session and refuses with operation_conflict.
func TestPauseRefusedWhilePublishing(t *testing.T) {
	s := &sandbox{state: &SandboxState{SandboxID: "sb1", Phase: PhaseReady, Lifecycle: &LifecycleState{}}, publishing: map[string]bool{"ws-9": true}}
	ae := kindOf(t, s.validatePause())
	require.Equal(t, api.KindOperationConflict, ae.Kind)
	require.Contains(t, ae.Message, "ws-9")
	delete(s.publishing, "ws-9")
	require.NoError(t, s.validatePause())
	s.state.Phase = PhaseStopping
	require.Equal(t, api.KindFailedPrecondition, kindOf(t, s.validatePause()).Kind)
	require.Equal(t, api.KindFailedPrecondition, kindOf(t, s.validateResume()).Kind)
}

// TestTTLSurvivesContinueAsNew: the TTL and its deadline travel in the
// continue-as-new input; the next run pauses at the same deadline.
func TestTTLSurvivesContinueAsNew(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(okDaemon)
	e.script(30*time.Minute, step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t),
		then: func() { e.SetContinueAsNewSuggested(true) }})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, SandboxTTL: 2 * time.Hour})
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(e.GetWorkflowError(), &can), "%v", e.GetWorkflowError())
	var next SandboxInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.NotNil(t, next.State)
	lc := next.State.Lifecycle
	require.NotNil(t, lc)
	require.Equal(t, 2*time.Hour, lc.TTL)
	require.Equal(t, next.State.Created.Add(2*time.Hour), *lc.ExpiresAt)

	e2 := newEnv(t)
	e2.daemon(okDaemon)
	stops := 0
	e2.OnActivity(acts.StopContainer, mock.Anything, "sb1").Return(func(context.Context, string) error { stops++; return nil })
	e2.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e2.RegisterDelayedCallback(func() {
		require.Equal(t, PhaseReady, e2.state().Phase, "the deadline is not re-armed by the new run")
		require.Contains(t, e2.state().Sessions, "ws-1")
	}, time.Hour)
	e2.RegisterDelayedCallback(func() {
		st := e2.state()
		require.Equal(t, PhasePaused, st.Phase)
		require.Equal(t, 1, stops)
	}, 150*time.Minute)
	e2.script(3*time.Hour, step{name: UpdateDestroy, check: ok(t)})
	e2.ExecuteWorkflow(SandboxWorkflowName, next)
	require.NoError(t, e2.GetWorkflowError())
}

// TestTTLWaitsForARunningPublish: a TTL that expires while a publish runs
// (its prepare retried by Temporal for a while) does not pause in the
// middle of it; the pause comes after the publish committed, retried on a
// bounded timer, not a loop of short ones.
func TestTTLWaitsForARunningPublish(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	prepares := 0
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		if call.Op == UpdatePublish { // the one exactly-once publish call
			prepares++
			if prepares < 9 { // about 20 s of Temporal's retries
				return nil, errors.New("daemon busy")
			}
		}
		return okDaemon(call)
	})
	stops := 0
	e.OnActivity(acts.StopContainer, mock.Anything, "sb1").Return(func(context.Context, string) error { stops++; return nil })
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(50*time.Minute, step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)})
	e.script(time.Hour-5*time.Second,
		step{name: UpdatePublish, args: []any{PublishRequest{WorkspaceSessionID: "ws-1"}}, check: func(_ json.RawMessage, err error) {
			require.NoError(t, err)
			require.Equal(t, 0, stops, "not paused in the middle of the publish")
		}})
	e.RegisterDelayedCallback(func() {
		st := e.state()
		require.Equal(t, PhasePaused, st.Phase)
		require.Equal(t, PausedByTTL, st.Lifecycle.PausedBy)
		require.Equal(t, 1, st.Publishes)
		require.Equal(t, 1, stops)
		require.Positive(t, st.Lifecycle.TTLPostponed, "the ttl expired during the publish")
		require.LessOrEqual(t, st.Lifecycle.TTLPostponed, 10, "retried every expireRetry, not in a tight loop")
	}, 2*time.Hour)
	e.script(3*time.Hour, step{name: UpdateDestroy, check: ok(t)})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, SandboxTTL: time.Hour})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, 9, prepares)
}

// TestResumeRecoversSessionsThatDidNotRestart: a session the daemon could
// not start again at its boot is recovered by the resume (its work kept).
func TestResumeRecoversSessionsThatDidNotRestart(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	recovered := []string{}
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		switch call.Op {
		case "list_workspace_sessions":
			return json.RawMessage(`{"workspace_sessions":[{"workspace_session_id":"ws-1","finalization_state":"finalize_failed"},{"workspace_session_id":"ws-2","finalization_state":"active"}]}`), nil
		case "recover_workspace_session":
			var a map[string]string
			require.NoError(t, json.Unmarshal(call.Args, &a))
			recovered = append(recovered, a["workspace_session_id"])
			return json.RawMessage(`{"workspace_session_id":"ws-1","previous_state":"finalize_failed","state":"active"}`), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.StopContainer, mock.Anything, "sb1").Return(nil)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(time.Minute,
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)},
		step{name: UpdatePause, check: ok(t)},
		step{name: UpdateResume, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			var r LifecycleResult
			require.NoError(t, json.Unmarshal(out, &r))
			require.Len(t, r.Sessions, 2)
			require.Equal(t, "active", r.Sessions[0].State)
		}},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, []string{"ws-1"}, recovered)
}
