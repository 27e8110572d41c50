package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

type env struct {
	*testsuite.TestWorkflowEnvironment
	t *testing.T
}

func newEnv(t *testing.T) *env {
	s := &testsuite.WorkflowTestSuite{}
	e := s.NewTestWorkflowEnvironment()
	e.RegisterWorkflowWithOptions(SandboxWorkflow, workflowOpts(SandboxWorkflowName))
	e.RegisterWorkflowWithOptions(PublishWorkflow, workflowOpts(PublishWorkflowName))
	e.RegisterActivityWithOptions(acts, activity.RegisterOptions{SkipInvalidStructFunctions: true})
	e.SetTestTimeout(30 * time.Second)
	return &env{e, t}
}

var spec = SandboxSpec{SandboxID: "sb1", Image: "img", WorkspaceRoot: "/src"}

var daemonEP = api.Endpoint{Host: "127.0.0.1", Port: 40001}

// importIn matches the import a new sandbox's create asks of its host's
// worker: the spec, and a request id derived from the workflow.
var importIn = mock.MatchedBy(func(in ImportWorkspaceInput) bool {
	return reflect.DeepEqual(in.Spec, spec) && strings.HasSuffix(in.RequestID, "/import_base") && len(in.RequestID) > len("/import_base")
})

// createSpec is CreateContainer's input for a new sandbox: the spec, with
// the prefetch of the workspace its streamed import follows.
var createSpec = func() SandboxSpec { s := spec; s.PrefetchWorkspace = true; return s }()

var imported = ImportWorkspaceResult{Copy: CopyReport{Files: 1, GitHead: "abc123"}, Base: api.InitBaseResult{BaseID: "B-1"}}

// happyCreate mocks every creation step to succeed.
func (e *env) happyCreate() {
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(nil)
	e.OnActivity(acts.CreateContainer, mock.Anything, createSpec).Return(ContainerInfo{Name: "eos-sbx-sb1"}, nil)
	e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, nil)
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: daemonEP}, nil)
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil)
}

// daemon answers CallDaemon by op.
func (e *env) daemon(f func(call DaemonCall) (json.RawMessage, error)) {
	answer := func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
		return f(call)
	}
	// A streamed create calls no daemon op through CallDaemon, and session
	// creates and publishes go local first: a run may not need it.
	e.OnActivity(acts.CallDaemon, mock.Anything, mock.Anything).Return(answer).Maybe()
	e.OnActivity(acts.CallDaemonHere, mock.Anything, mock.Anything).Return(answer)
}

func okDaemon(call DaemonCall) (json.RawMessage, error) {
	switch call.Op {
	case "init_base":
		return json.RawMessage(`{"base_id":"B-1"}`), nil
	case "create_workspace_session":
		return json.RawMessage(`{"workspace_session_id":"ws-1","network_profile":"shared"}`), nil
	case "publish_workspace_session":
		var a api.PublishArgs
		if err := json.Unmarshal(call.Args, &a); err != nil || !a.ExactlyOnce || a.TxID == "" {
			return nil, apperr.Newf(api.KindInvalidRequest, nil, "the sandbox workflow publishes exactly once by a txid: %s", call.Args)
		}
		return json.RawMessage(`{"txid":"` + a.TxID + `","workspace_session_id":"` + a.WorkspaceSessionID + `","publish":{"no_op":false,"layer_id":"L-2"},"destroyed":true,"clean":true}`), nil
	case "publish_prepare":
		return json.RawMessage(`{"clean":true}`), nil
	case "publish_commit":
		return json.RawMessage(`{"publish":{"no_op":false}}`), nil
	case "publish_finalize":
		return json.RawMessage(`{"workspace_session_id":"ws-1","publish":{"no_op":false},"destroyed":true}`), nil
	}
	return json.RawMessage(`{}`), nil
}

// step is one update of a scripted conversation with the workflow.
type step struct {
	name  string
	args  []any
	check func(out json.RawMessage, err error)
	then  func() // runs after check, before the next step (queries, flags)
}

// script runs steps one after another, each when the previous completed
// (updates in the test environment finish asynchronously), starting at
// delay; it fails the test if a step never completes.
func (e *env) script(delay time.Duration, steps ...step) {
	ran := 0
	var run func(i int)
	run = func(i int) {
		if i == len(steps) {
			return
		}
		st := steps[i]
		finish := func(out json.RawMessage, err error) {
			ran++
			if st.check != nil {
				st.check(out, err)
			}
			if st.then != nil {
				st.then()
			}
			run(i + 1)
		}
		e.UpdateWorkflow(st.name, fmt.Sprintf("%s-%d", st.name, i), &testsuite.TestUpdateCallback{
			OnAccept: func() {},
			OnReject: func(err error) { finish(nil, err) },
			OnComplete: func(v interface{}, err error) {
				var out json.RawMessage
				if b, ok := v.(json.RawMessage); ok {
					out = b
				} else if v != nil {
					out, _ = json.Marshal(v)
				}
				finish(out, err)
			},
		}, st.args...)
	}
	e.RegisterDelayedCallback(func() { run(0) }, delay)
	e.t.Cleanup(func() { require.Equal(e.t, len(steps), ran, "scripted updates that completed") })
}

func ok(t *testing.T) func(json.RawMessage, error) {
	return func(_ json.RawMessage, err error) { require.NoError(t, err) }
}

func TestSandboxLifecycle(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(okDaemon)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
	var published json.RawMessage
	e.script(time.Second,
		step{name: UpdateWaitReady, check: ok(t)},
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{Agent: "a"}}, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			require.Contains(t, string(out), "ws-1")
		}},
		step{name: UpdatePublish, args: []any{PublishRequest{WorkspaceSessionID: "ws-1"}}, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			published = out
		}},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.True(t, e.IsWorkflowCompleted())
	require.NoError(t, e.GetWorkflowError())
	var res SandboxResult
	require.NoError(t, e.GetWorkflowResult(&res))
	require.Equal(t, PhaseStopped, res.Phase)
	require.Contains(t, string(published), `"destroyed":true`)
	e.AssertExpectations(t)
}

func TestCreateFailsPermanentlyAndCompensates(t *testing.T) {
	for _, step := range []string{"CreateContainer", "StartContainer", "WaitReady", "ImportWorkspace"} {
		t.Run(step, func(t *testing.T) {
			e := newEnv(t)
			fail := apperr.Newf(api.KindInvalidRequest, nil, "boom")
			e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(nil)
			ret := func(name string) error {
				if name == step {
					return fail
				}
				return nil
			}
			e.OnActivity(acts.CreateContainer, mock.Anything, createSpec).Return(ContainerInfo{}, ret("CreateContainer")).Maybe()
			e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Daemon: daemonEP}, ret("StartContainer")).Maybe()
			e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(ret("WaitReady")).Maybe()
			e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, ret("ImportWorkspace")).Maybe()
			e.daemon(okDaemon)
			removed := 0
			e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(func(_ context.Context, _ string) error { removed++; return nil })
			e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
			require.True(t, e.IsWorkflowCompleted())
			require.Error(t, e.GetWorkflowError())
			require.Equal(t, 1, removed, "the saga removed what it created")
		})
	}
}

func TestMissingImageCreatesNothing(t *testing.T) {
	e := newEnv(t)
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(apperr.Newf(api.KindInvalidRequest, nil, "image img is not present"))
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	err := e.GetWorkflowError()
	require.Error(t, err)
	var app *temporal.ApplicationError
	require.True(t, errors.As(err, &app))
	require.Equal(t, api.KindInvalidRequest, app.Type())
	e.AssertNotCalled(t, "CreateVolume", mock.Anything, mock.Anything)
	e.AssertNotCalled(t, "CreateContainer", mock.Anything, mock.Anything)
}

func TestTransientFailureIsRetried(t *testing.T) {
	e := newEnv(t)
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(nil)
	e.OnActivity(acts.CreateContainer, mock.Anything, createSpec).Return(ContainerInfo{}, nil)
	e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, nil)
	calls := 0
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(func(_ context.Context, _ string) (ContainerInfo, error) {
		calls++
		if calls < 3 {
			return ContainerInfo{}, errors.New("docker daemon hiccup")
		}
		return ContainerInfo{Daemon: daemonEP}, nil
	})
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil)
	e.daemon(okDaemon)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(time.Minute, step{name: UpdateWaitReady, check: ok(t)}, step{name: UpdateDestroy, check: ok(t)})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, 3, calls)
}

func TestUpdateValidation(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		if call.Op == "destroy_workspace_session" {
			return nil, apperr.New(api.Errorf(api.KindOperationFailed, map[string]any{"active_command_session_ids": []string{"cmd_1"}}, "busy"))
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(time.Second,
		step{name: UpdatePublish, args: []any{PublishRequest{WorkspaceSessionID: "ws-nope"}}, check: func(_ json.RawMessage, err error) {
			require.ErrorContains(t, err, "workspace session not found")
		}},
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)},
		step{name: UpdateDestroySession, args: []any{SessionRequest{WorkspaceSessionID: "ws-1"}}, check: func(_ json.RawMessage, err error) {
			var app *temporal.ApplicationError
			require.True(t, errors.As(err, &app), "%v", err)
			require.Equal(t, api.KindOperationFailed, app.Type())
			e, ok := apperr.From(err)
			require.True(t, ok)
			// As the gateway answers it (a local call's details may keep
			// their Go types where an activity's come back decoded).
			got, _ := json.Marshal(e.Details["active_command_session_ids"])
			require.JSONEq(t, `["cmd_1"]`, string(got))
		}},
		step{name: UpdateAmend, args: []any{AmendRequest{Op: "exec_command"}}, check: func(_ json.RawMessage, err error) {
			require.ErrorContains(t, err, "amend supports")
		}},
		step{name: UpdateExport, args: []any{ExportRequest{Dest: "relative/path"}}, check: func(_ json.RawMessage, err error) {
			require.ErrorContains(t, err, "absolute")
		}},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
}

func TestUpdatesBeforeReadyAreRejected(t *testing.T) {
	e := newEnv(t)
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(func(_ context.Context, _ string) error {
		return nil
	})
	e.OnActivity(acts.CreateContainer, mock.Anything, createSpec).After(time.Hour).Return(ContainerInfo{}, nil)
	e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, nil)
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Daemon: daemonEP}, nil)
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil)
	e.daemon(okDaemon)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(time.Minute, step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: func(_ json.RawMessage, err error) {
		require.ErrorContains(t, err, "is creating")
	}}, step{name: UpdateDestroy, check: ok(t)})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
}

// A conflict the daemon's publish reports reaches the caller with its
// report, as the child's did (kind operation_failed, the conflicts, the
// txid); the session is kept, and nothing else is asked of the daemon (no
// abort or finalize: the exactly-once publish committed nothing).
func TestPublishConflictReachesTheCaller(t *testing.T) {
	const report = `{"txid":"t","workspace_session_id":"ws-1","publish":null,"destroyed":false,"clean":false,"conflicts":[{"path":"f.txt","kind":"content"}],"head_revision":{"manifest_version":3},"publish_rejection":{"path":"f.txt","reason":"source_conflict"}}`
	e := newEnv(t)
	e.happyCreate()
	var ops []string
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		ops = append(ops, call.Op)
		if call.Op == UpdatePublish {
			return json.RawMessage(report), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(time.Second,
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)},
		step{name: UpdatePublish, args: []any{PublishRequest{WorkspaceSessionID: "ws-1"}}, check: func(_ json.RawMessage, err error) {
			ae, ok := apperr.From(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, api.KindOperationFailed, ae.Kind)
			require.Contains(t, ae.Message, "publish rejected: 1 conflicting path(s)")
			d := ae.Details
			require.Contains(t, d, "conflicts")
			require.Equal(t, PublishWorkflowID("sb1", "ws-1", 1), d["txid"])
			require.Equal(t, true, d["session_retained"])
		}, then: func() {
			// The session is kept for the agent to fix and publish again.
			v, err := e.QueryWorkflow(QueryState)
			require.NoError(t, err)
			var st SandboxState
			require.NoError(t, v.Get(&st))
			require.Contains(t, st.Sessions, "ws-1")
			require.Zero(t, st.Publishes)
		}},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, []string{"create_workspace_session", UpdatePublish}, ops)
}

func TestContinueAsNewCarriesState(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(okDaemon)
	e.script(time.Second, step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t),
		then: func() { e.SetContinueAsNewSuggested(true) }})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, SessionTTL: time.Minute})
	err := e.GetWorkflowError()
	var can interface{ Error() string }
	require.Error(t, err)
	can = err
	require.Contains(t, can.Error(), "continue as new")
}

// TestContainerLostFailsAndKeepsTheVolume: a sandbox whose container
// vanished fails, and its state volume — the work — is not removed (it is
// an orphan to adopt or delete).
func TestContainerLostFailsAndKeepsTheVolume(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(okDaemon)
	removed := false
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(func(_ context.Context, _ string) error { removed = true; return nil })
	e.RegisterDelayedCallback(func() { e.SignalWorkflow(SignalContainerLost, "gone") }, time.Minute)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	var res SandboxResult
	require.NoError(t, e.GetWorkflowResult(&res))
	require.Equal(t, PhaseFailed, res.Phase)
	require.False(t, removed, "nothing is deleted by inference")
}

func TestIdleSessionsAreReaped(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	reaps := 0
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		if call.Op == "archive_idle_sessions" {
			reaps++
			return json.RawMessage(`{"archived":[{"workspace_session_id":"ws-1","path":"/eos/archive/ws-1","bytes":3}]}`), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	e.script(time.Second, step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)})
	e.RegisterDelayedCallback(func() {
		v, err := e.QueryWorkflow(QueryState)
		require.NoError(t, err)
		var st SandboxState
		require.NoError(t, v.Get(&st))
		require.NotContains(t, st.Sessions, "ws-1")
		require.Len(t, st.Archived, 1)
	}, 2*time.Hour)
	e.script(3*time.Hour, step{name: UpdateDestroy, check: ok(t)})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, SessionTTL: time.Hour})
	require.NoError(t, e.GetWorkflowError())
	require.Positive(t, reaps)
}

// Two publishes of one session sent together: one runs, the other is
// refused (operation conflict) and nothing is published twice.
func TestOnePublishPerSessionAtATime(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	var prepares []string
	e.OnActivity(acts.CallDaemon, mock.Anything, mock.Anything).After(200 * time.Millisecond).Return(func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
		if call.Op == UpdatePublish {
			var a struct {
				WS string `json:"workspace_session_id"`
			}
			_ = json.Unmarshal(call.Args, &a)
			prepares = append(prepares, a.WS)
		}
		if call.Op == "create_workspace_session" {
			return json.RawMessage(`{"workspace_session_id":"ws-0","network_profile":"shared"}`), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	results := map[string]error{}
	send := func(id, ws string) {
		e.UpdateWorkflow(UpdatePublish, id, &testsuite.TestUpdateCallback{
			OnAccept:   func() {},
			OnReject:   func(err error) { results[id] = err },
			OnComplete: func(_ interface{}, err error) { results[id] = err },
		}, PublishRequest{WorkspaceSessionID: ws})
	}
	e.script(time.Second, step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t), then: func() {
		send("first", "ws-0")
		send("second", "ws-0")
	}})
	e.RegisterDelayedCallback(func() {
		e.UpdateWorkflow(UpdateDestroy, "destroy", &testsuite.TestUpdateCallback{OnAccept: func() {}, OnReject: func(error) {}, OnComplete: func(interface{}, error) {}})
	}, 30*time.Second)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.NoError(t, results["first"])
	var app *temporal.ApplicationError
	require.True(t, errors.As(results["second"], &app), "the second publish of ws-0 is refused: %v", results["second"])
	require.Equal(t, api.KindOperationConflict, app.Type())
	require.Equal(t, []string{"ws-0"}, prepares, "one publish ran")
}

// The create_workspace_session update passes network_profile and egress to
// the daemon as the caller gave them (the daemon validates them).
func TestCreateSessionPassesEgress(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	var sent json.RawMessage
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		if call.Op == "create_workspace_session" {
			sent = call.Args
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
	e.script(time.Second,
		step{name: UpdateWaitReady, check: ok(t)},
		step{name: UpdateCreateSession, args: []any{map[string]any{"network_profile": "isolated", "egress": []string{"10.0.0.0/8:443"}}}, check: ok(t)},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.JSONEq(t, `{"network_profile":"isolated","egress":["10.0.0.0/8:443"]}`, string(sent))
}

// Verified publishes queue in the order the workflow accepted them: the
// second's daemon call starts after the first's ended, the queue is in the
// state meanwhile, and the daemon is asked for exactly-once verified
// publishes with the defaults filled in.
func TestVerifiedPublishesQueueInOrder(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	var calls []api.PublishArgs
	var seen [][]QueuedPublish
	n := 0
	e.OnActivity(acts.CallDaemon, mock.Anything, mock.Anything).After(time.Second).Return(func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
		if call.Op == "create_workspace_session" {
			n++
			return json.RawMessage(fmt.Sprintf(`{"workspace_session_id":"ws-%d","network_profile":"shared"}`, n)), nil
		}
		if call.Op == UpdatePublish {
			var a api.PublishArgs
			require.NoError(t, json.Unmarshal(call.Args, &a))
			calls = append(calls, a)
			return json.RawMessage(`{"txid":"` + a.TxID + `","workspace_session_id":"` + a.WorkspaceSessionID + `","publish":{"no_op":false},"destroyed":true,"clean":true,` +
				`"verify":{"passed":true,"status":"ok","exit_code":0,"output_tail":"ok\n","verified_head":{"manifest_version":2},"attempts":1}}`), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	results := map[string]error{}
	outs := map[string]string{}
	cmd := "make test"
	send := func(id, ws string) {
		e.UpdateWorkflow(UpdatePublish, id, &testsuite.TestUpdateCallback{
			OnAccept: func() {},
			OnReject: func(err error) { results[id] = err },
			OnComplete: func(v interface{}, err error) {
				results[id] = err
				if b, ok := v.(json.RawMessage); ok {
					outs[id] = string(b)
				}
			},
		}, PublishRequest{WorkspaceSessionID: ws, Verify: &cmd})
	}
	// Virtual time: every daemon call takes 1 s; the sessions exist at 7 s,
	// the first publish's call runs 7-8 s, the second's 8-9 s.
	e.script(5*time.Second,
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)},
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t), then: func() {
			send("first", "ws-1")
			send("second", "ws-2")
		}})
	snap := func() {
		v, err := e.QueryWorkflow(QueryState)
		require.NoError(t, err)
		var st SandboxState
		require.NoError(t, v.Get(&st))
		var q []QueuedPublish
		for _, p := range st.PublishQueue {
			q = append(q, *p)
		}
		seen = append(seen, q)
	}
	e.RegisterDelayedCallback(snap, 7500*time.Millisecond)
	e.RegisterDelayedCallback(func() {
		e.UpdateWorkflow(UpdateDestroy, "destroy", &testsuite.TestUpdateCallback{OnAccept: func() {}, OnReject: func(error) {}, OnComplete: func(interface{}, error) {}})
	}, time.Minute)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.NoError(t, results["first"])
	require.NoError(t, results["second"])
	require.Contains(t, outs["first"], `"verify":{"passed":true`)
	require.Len(t, calls, 2)
	require.Equal(t, "ws-1", calls[0].WorkspaceSessionID, "in the order accepted")
	require.Equal(t, "ws-2", calls[1].WorkspaceSessionID)
	for _, c := range calls {
		require.True(t, c.ExactlyOnce)
		require.NotNil(t, c.Verify)
		require.Equal(t, api.PublishVerify{Cmd: "make test", TimeoutMS: api.DefaultVerifyTimeoutS * 1000, Retries: api.DefaultVerifyRetries}, *c.Verify)
	}
	require.Len(t, seen, 1)
	require.Len(t, seen[0], 2, "both queued while the first verifies: %+v", seen)
	require.Equal(t, "ws-1", seen[0][0].WorkspaceSessionID)
	require.Equal(t, "verifying", seen[0][0].State)
	require.NotNil(t, seen[0][0].StartedAt)
	require.Equal(t, 1, seen[0][0].Position)
	require.Equal(t, "queued", seen[0][1].State)
	require.Equal(t, 2, seen[0][1].Position)
	require.Nil(t, seen[0][1].StartedAt)
}

// A failed verification reaches the caller with the command's exit code and
// output; the session is kept.
func TestVerifiedPublishFailureReachesTheCaller(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		if call.Op == UpdatePublish {
			return json.RawMessage(`{"txid":"t","workspace_session_id":"ws-1","publish":null,"destroyed":false,"clean":false,` +
				`"verify":{"passed":false,"status":"error","exit_code":3,"output_tail":"FAIL: TestX\n","verified_head":{"manifest_version":4},"attempts":1}}`), nil
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	cmd := "exit 3"
	e.script(time.Second,
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)},
		step{name: UpdatePublish, args: []any{PublishRequest{WorkspaceSessionID: "ws-1", Verify: &cmd}}, check: func(_ json.RawMessage, err error) {
			ae, ok := apperr.From(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, api.KindOperationFailed, ae.Kind)
			require.Contains(t, ae.Message, "exited 3")
			require.Equal(t, "verify", ae.Details["stage"])
			require.Equal(t, "verify_failed", ae.Details["reason"])
			require.Equal(t, "FAIL: TestX\n", ae.Details["output_tail"])
			require.EqualValues(t, 3, *(ae.Details["exit_code"].(*int)))
		}, then: func() {
			v, err := e.QueryWorkflow(QueryState)
			require.NoError(t, err)
			var st SandboxState
			require.NoError(t, v.Get(&st))
			require.Contains(t, st.Sessions, "ws-1")
			require.Empty(t, st.PublishQueue)
		}},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
}

// Bad verify arguments are refused before the update is accepted: nothing
// reaches the daemon.
func TestVerifiedPublishRefusesBadInput(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	published := 0
	e.daemon(func(call DaemonCall) (json.RawMessage, error) {
		if call.Op == UpdatePublish {
			published++
		}
		return okDaemon(call)
	})
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	sp := func(s string) *string { return &s }
	ip := func(n int64) *int64 { return &n }
	refused := func(arg string) func(json.RawMessage, error) {
		return func(_ json.RawMessage, err error) {
			ae, ok := apperr.From(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, api.KindInvalidRequest, ae.Kind, "%v", err)
			require.Equal(t, arg, ae.Details["arg"])
		}
	}
	steps := []step{{name: UpdateCreateSession, args: []any{CreateSessionRequest{}}, check: ok(t)}}
	for _, c := range []struct {
		r   PublishRequest
		arg string
	}{
		{PublishRequest{WorkspaceSessionID: "ws-1", Verify: sp("")}, "verify"},
		{PublishRequest{WorkspaceSessionID: "ws-1", Verify: sp("  \n")}, "verify"},
		{PublishRequest{WorkspaceSessionID: "ws-1", Verify: sp("true"), VerifyTimeoutS: ip(0)}, "verify_timeout_s"},
		{PublishRequest{WorkspaceSessionID: "ws-1", Verify: sp("true"), VerifyTimeoutS: ip(1 << 40)}, "verify_timeout_s"},
		{PublishRequest{WorkspaceSessionID: "ws-1", Verify: sp("true"), VerifyRetries: ip(-1)}, "verify_retries"},
		{PublishRequest{WorkspaceSessionID: "ws-1", Verify: sp("true"), VerifyRetries: ip(99)}, "verify_retries"},
	} {
		steps = append(steps, step{name: UpdatePublish, args: []any{c.r}, check: refused(c.arg)})
	}
	steps = append(steps, step{name: UpdateDestroy, check: ok(t)})
	e.script(time.Second, steps...)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.Zero(t, published)
}

// TestDrainingRefusesNewUpdates: a run about to continue as new refuses
// every update in its validator (KindContinuing, which lifecycle.Send sends
// again to the next run); before that, each validator decides as its own.
func TestDrainingRefusesNewUpdates(t *testing.T) {
	s := &sandbox{state: &SandboxState{SandboxID: "sb1", Phase: PhaseReady, Sessions: map[string]*SessionRecord{"ws-1": {ID: "ws-1"}}},
		publishing: map[string]bool{}}
	destroy := s.guarded(UpdateDestroySession, s.destroySession, s.validateSession).(func(SessionRequest) error)
	waitReady := s.guarded(UpdateWaitReady, s.waitReady, nil).(func() error)
	require.NoError(t, destroy(SessionRequest{WorkspaceSessionID: "ws-1"}))
	e, _ := apperr.From(destroy(SessionRequest{WorkspaceSessionID: "ws-2"}))
	require.Equal(t, api.KindNotFound, e.Kind, "the handler's own validator")
	require.NoError(t, waitReady())

	s.draining = true
	for _, err := range []error{destroy(SessionRequest{WorkspaceSessionID: "ws-1"}), waitReady()} {
		e, ok := apperr.From(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, KindContinuing, e.Kind)
		require.Equal(t, "sb1", e.Details["sandbox_id"])
	}
}

// TestUpdateArgsOverTheCapAreRefused: an update whose arguments would make
// a history event over Temporal's limit is refused in its validator (no
// trace in the history), whoever sent it; one at the cap is not.
func TestUpdateArgsOverTheCapAreRefused(t *testing.T) {
	s := &sandbox{state: &SandboxState{SandboxID: "sb1", Phase: PhaseReady, Sessions: map[string]*SessionRecord{"ws-1": {ID: "ws-1"}}},
		publishing: map[string]bool{}}
	publish := s.guarded(UpdatePublish, s.publish, nil).(func(PublishRequest) error)
	amend := s.guarded(UpdateAmend, s.amend, nil).(func(AmendRequest) error)
	one, err := json.Marshal(PublishRequest{WorkspaceSessionID: "ws-1", Message: "m"})
	require.NoError(t, err)
	around := len(one) - 1 // the request's bytes besides its message
	require.NoError(t, publish(PublishRequest{WorkspaceSessionID: "ws-1", Message: strings.Repeat("m", api.MaxUpdateArgsBytes-around)}))
	for _, err := range []error{
		publish(PublishRequest{WorkspaceSessionID: "ws-1", Message: strings.Repeat("m", api.MaxUpdateArgsBytes-around+1)}),
		amend(AmendRequest{Op: "file_write", Args: []byte(`{"path":"a","content":"` + strings.Repeat("x", api.MaxUpdateArgsBytes) + `"}`)}),
	} {
		e, ok := apperr.From(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, api.KindResourceExhausted, e.Kind)
		require.Equal(t, "max_update_args_bytes", e.Details["limit"])
	}
}

// TestHandOverWaitsOutALongUpdate: a run due to continue as new while a
// long update runs (an export for an hour) refuses new updates only for a
// moment (drainPatience after its first wait), then takes them again until
// the long one finished, and continues as new after it.
func TestHandOverWaitsOutALongUpdate(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(okDaemon)
	e.OnActivity(acts.ExportChanges, mock.Anything, mock.Anything).After(time.Hour).Return(&api.ExportResult{}, nil)
	got := map[string]error{}
	send := func(at time.Duration, id, name string, args ...any) {
		e.RegisterDelayedCallback(func() {
			e.UpdateWorkflow(name, id, &testsuite.TestUpdateCallback{
				OnAccept:   func() {},
				OnReject:   func(err error) { got[id] = err },
				OnComplete: func(_ interface{}, err error) { got[id] = err },
			}, args...)
		}, at)
	}
	send(time.Second, "export", UpdateExport, ExportRequest{Dest: "/out/changes.patch", Format: "patch"})
	drainAt := 2 * time.Second
	e.RegisterDelayedCallback(func() { e.SetContinueAsNewSuggested(true) }, drainAt)
	send(drainAt+drainPatience/2, "waiting", UpdateCreateSession, CreateSessionRequest{})   // the drain's first wait takes updates
	send(drainAt+3*drainPatience/2, "refused", UpdateCreateSession, CreateSessionRequest{}) // its second refuses them
	send(10*time.Second, "after", UpdateCreateSession, CreateSessionRequest{})              // the long update still runs
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.ErrorContains(t, e.GetWorkflowError(), "continue as new")
	require.NoError(t, got["export"])
	require.NoError(t, got["waiting"])
	require.NoError(t, got["after"], "taken while the long update runs")
	ae, ok := apperr.From(got["refused"])
	require.True(t, ok, "%v", got["refused"])
	require.Equal(t, KindContinuing, ae.Kind)
}

// TestContainerLostWhileDrainingEndsTheRun: a container lost while the
// run drains for a hand-over ends the run as failed; it is not handed to a
// next run that would not know.
func TestContainerLostWhileDrainingEndsTheRun(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(okDaemon)
	e.OnActivity(acts.ExportChanges, mock.Anything, mock.Anything).After(time.Hour).Return(&api.ExportResult{}, nil)
	e.RegisterDelayedCallback(func() {
		e.UpdateWorkflow(UpdateExport, "export", &testsuite.TestUpdateCallback{OnAccept: func() {}, OnReject: func(error) {}, OnComplete: func(interface{}, error) {}},
			ExportRequest{Dest: "/out/changes.patch", Format: "patch"})
	}, time.Second)
	e.RegisterDelayedCallback(func() { e.SetContinueAsNewSuggested(true) }, 2*time.Second)
	e.RegisterDelayedCallback(func() { e.SignalWorkflow(SignalContainerLost, "gone") }, time.Minute)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError(), "failed, not continued as new")
	var res SandboxResult
	require.NoError(t, e.GetWorkflowResult(&res))
	require.Equal(t, PhaseFailed, res.Phase)
	require.Contains(t, res.Error, "container lost")
}
