package apperr

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// A refusal raised in an activity reaches whoever reads the workflow's
// failure with its kind, message and details unchanged, even when the
// workflow wrapped it (fmt.Errorf("prepare: %w") turns into Temporal's
// "wrapError" application error around the activity failure).
func TestRefusalCrossesTemporalUnchanged(t *testing.T) {
	refusal := api.Errorf(api.KindOperationConflict, map[string]any{"active_command_session_ids": []any{"cmd_1"}, "workspace_session_id": "ws-1"},
		"workspace session ws-1 has running commands")
	for _, wrap := range []bool{false, true} {
		t.Run(fmt.Sprintf("wrapped=%v", wrap), func(t *testing.T) {
			var s testsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			env.RegisterActivityWithOptions(func(context.Context) error { return New(refusal) }, activity.RegisterOptions{Name: "refuse"})
			env.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
				ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
				err := workflow.ExecuteActivity(ctx, "refuse").Get(ctx, nil)
				if wrap {
					return fmt.Errorf("prepare: %w", err)
				}
				return err
			}, workflow.RegisterOptions{Name: "wf"})
			env.ExecuteWorkflow("wf")
			err := env.GetWorkflowError()
			require.Error(t, err)
			got, ok := From(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, refusal.Kind, got.Kind)
			require.Equal(t, refusal.Message, got.Message)
			require.Equal(t, refusal.Details, got.Details)
			c := Client(err)
			require.Equal(t, refusal.Message, c.Message)
			require.NotContains(t, c.Message, "activity")
			require.NotContains(t, c.Details, "type")
		})
	}
}

func TestFrom(t *testing.T) {
	_, ok := From(nil)
	require.False(t, ok)
	_, ok = From(errors.New("plain"))
	require.False(t, ok)

	// Legacy types recorded before refusals carried an *api.Error.
	for typ, kind := range legacyKinds {
		e, ok := From(temporal.NewApplicationError("msg", typ))
		require.True(t, ok)
		require.Equal(t, kind, e.Kind, typ)
		require.Equal(t, "msg", e.Message)
	}
	// An unknown type is operation_failed with the message; a detail of
	// another shape is no *api.Error and no panic.
	e, ok := From(temporal.NewApplicationError("m", "SomethingElse", map[string]int{"x": 1}))
	require.True(t, ok)
	require.Equal(t, api.KindOperationFailed, e.Kind)
	e, ok = From(temporal.NewApplicationError("m", "x", 42))
	require.True(t, ok)
	require.Equal(t, api.KindOperationFailed, e.Kind)

	// Retryable keeps the error for the last attempt.
	e, ok = From(Retryable(api.Errorf(api.KindServerBusy, nil, "busy")))
	require.True(t, ok)
	require.Equal(t, api.KindServerBusy, e.Kind)

	// Timeouts and cancellations say so, without Temporal's words.
	require.Contains(t, Client(context.DeadlineExceeded).Message, "did not finish in time")
	require.Equal(t, api.KindInternal, Client(errors.New("boom")).Kind)
}
