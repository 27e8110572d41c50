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
				time.Sleep(localCallTimeout(UpdatePublish) + 300*time.Millisecond)
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
