package workflows

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// A session create and a publish call the daemon locally first, with the
// sandbox's host queue; a local call that fails the way a second call
// could mend (another host, an unreachable daemon) goes on as the
// CallDaemon activity with the same call; a daemon's refusal is the
// answer, not retried; a verified publish never runs locally.
func TestLocalDaemonCallsAndTheirFallback(t *testing.T) {
	for _, tc := range []struct {
		name string
		// local answers the local call of op; nil: the daemon's answer.
		local        func(op string) error
		wantLocal    map[string]int // local calls by op
		wantActivity map[string]int // CallDaemon calls by op (besides init_base)
		wantErrKind  string         // of the publish
	}{
		{name: "local answers", local: func(string) error { return nil },
			wantLocal: map[string]int{"create_workspace_session": 1, UpdatePublish: 1}, wantActivity: map[string]int{}},
		{name: "another host", local: func(string) error {
			return errNotHere
		}, wantLocal: map[string]int{"create_workspace_session": 1, UpdatePublish: 1},
			wantActivity: map[string]int{"create_workspace_session": 1, UpdatePublish: 1}},
		{name: "daemon unreachable from the local call", local: func(string) error {
			return errUnreachable
		}, wantLocal: map[string]int{"create_workspace_session": 1, UpdatePublish: 1},
			wantActivity: map[string]int{"create_workspace_session": 1, UpdatePublish: 1}},
		{name: "the local publish takes longer than its bound", local: func(op string) error {
			if op == UpdatePublish {
				bound, _ := localCallTimeout(UpdatePublish)
				time.Sleep(bound + 300*time.Millisecond)
			}
			return nil
		}, wantLocal: map[string]int{"create_workspace_session": 1, UpdatePublish: 1},
			wantActivity: map[string]int{UpdatePublish: 1}},
		{name: "daemon refuses the publish", local: func(op string) error {
			if op == UpdatePublish {
				return apperr.Newf(api.KindResourceExhausted, nil, "too deep")
			}
			return nil
		}, wantLocal: map[string]int{"create_workspace_session": 1, UpdatePublish: 1}, wantActivity: map[string]int{},
			wantErrKind: api.KindResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.happyCreate()
			local, activity := map[string]int{}, map[string]int{}
			var queues []string
			e.OnActivity(acts.CallDaemonHere, mock.Anything, mock.Anything).Return(func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
				local[call.Op]++
				queues = append(queues, call.HostQueue)
				if err := tc.local(call.Op); err != nil {
					return nil, err
				}
				return okDaemon(call)
			})
			e.OnActivity(acts.CallDaemon, mock.Anything, mock.Anything).Return(func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
				if call.Op != "init_base" {
					activity[call.Op]++
				}
				return okDaemon(call)
			})
			e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
			publishOK := ok(t)
			if tc.wantErrKind != "" {
				publishOK = refused(t, tc.wantErrKind)
			}
			e.script(time.Second,
				step{name: UpdateWaitReady, check: ok(t)},
				step{name: UpdateCreateSession, check: ok(t)},
				step{name: UpdatePublish, args: []any{PublishRequest{WorkspaceSessionID: "ws-1"}}, check: publishOK},
				step{name: UpdateDestroy, check: ok(t)},
			)
			e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, HostQueue: "eos-host-h1"})
			require.NoError(t, e.GetWorkflowError())
			require.Equal(t, tc.wantLocal, local)
			require.Equal(t, tc.wantActivity, activity)
			for _, q := range queues {
				require.Equal(t, "eos-host-h1", q, "a local call says which host it must run on")
			}
		})
	}
}

var errNotHere = temporal.NewNonRetryableApplicationError("the sandbox's daemon is on another host", ErrTypeNotHere, nil)

func refused(t *testing.T, kind string) func(json.RawMessage, error) {
	return func(_ json.RawMessage, err error) {
		require.Error(t, err)
		require.Equal(t, kind, kindOf(t, err).Kind)
	}
}

// A session destroy calls the daemon locally first too. A local destroy
// that outgrows its bound goes on as the activity, whose call finds the
// session gone (the first call did it): the update answers destroyed, and
// the sandbox forgets the session. An unknown session stays not_found.
func TestLocalDestroyAndItsFallback(t *testing.T) {
	bound, _ := localCallTimeout("destroy_workspace_session")
	for _, tc := range []struct {
		name         string
		slow         bool // the local destroy outgrows its bound (and does destroy)
		wantActivity int
	}{
		{name: "local answers"},
		{name: "the local destroy takes longer than its bound", slow: true, wantActivity: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.happyCreate()
			gone := false // the daemon's session ws-1
			local, activity := 0, 0
			destroy := func(call DaemonCall) (json.RawMessage, error) {
				if gone {
					return nil, apperr.Newf(api.KindNotFound, map[string]any{"workspace_session_id": "ws-1"}, "workspace session not found: ws-1")
				}
				gone = true
				return json.RawMessage(`{"workspace_session_id":"ws-1","destroyed":true,"evicted_upperdir_bytes":7}`), nil
			}
			e.OnActivity(acts.CallDaemonHere, mock.Anything, mock.Anything).Return(func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
				if call.Op != "destroy_workspace_session" {
					return okDaemon(call)
				}
				local++
				out, err := destroy(call)
				if tc.slow {
					time.Sleep(bound + 300*time.Millisecond)
				}
				return out, err
			})
			e.OnActivity(acts.CallDaemon, mock.Anything, mock.Anything).Return(func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
				if call.Op != "destroy_workspace_session" {
					return okDaemon(call)
				}
				activity++
				return destroy(call)
			})
			e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
			destroyed := func(out json.RawMessage, err error) {
				require.NoError(t, err)
				var d api.SessionDestroyed
				require.NoError(t, json.Unmarshal(out, &d))
				require.True(t, d.Destroyed, "%s", out)
				require.Equal(t, "ws-1", d.WorkspaceSessionID)
			}
			e.script(time.Second,
				step{name: UpdateWaitReady, check: ok(t)},
				step{name: UpdateCreateSession, check: ok(t)},
				step{name: UpdateDestroySession, args: []any{SessionRequest{WorkspaceSessionID: "ws-1"}}, check: destroyed},
				// Forgotten: a second destroy is refused not_found (by the
				// update's validator: no daemon call).
				step{name: UpdateDestroySession, args: []any{SessionRequest{WorkspaceSessionID: "ws-1"}}, check: refused(t, api.KindNotFound)},
				step{name: UpdateDestroy, check: ok(t)},
			)
			e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, HostQueue: "eos-host-h1"})
			require.NoError(t, e.GetWorkflowError())
			require.Equal(t, 1, local, "the destroy calls locally first")
			require.Equal(t, tc.wantActivity, activity)
		})
	}
}
