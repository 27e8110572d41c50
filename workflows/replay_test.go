package workflows_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// replayer registers the workflows the way worker.Register does: by their
// stable names, without aliasing (the worker sets
// DisableRegistrationAliasing, and the replayer must match it).
func replayer(t *testing.T, sandbox, publish any) worker.WorkflowReplayer {
	r, err := worker.NewWorkflowReplayerWithOptions(worker.WorkflowReplayerOptions{DisableRegistrationAliasing: true})
	require.NoError(t, err)
	r.RegisterWorkflowWithOptions(sandbox, workflow.RegisterOptions{Name: workflows.SandboxWorkflowName})
	r.RegisterWorkflowWithOptions(publish, workflow.RegisterOptions{Name: workflows.PublishWorkflowName})
	return r
}

func histories(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no histories: record them with EOS_RECORD_HISTORIES=1 go test -run '^TestRecordHistories$' ./worker/")
	return files
}

func testLogger(t *testing.T) sdklog.Logger {
	return sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// TestReplayHistories replays every recorded history (worker/history_test.go
// records them from real runs) against today's workflow code. A failure is
// a non-deterministic change: running workflows recorded by the old code
// would break on the next worker. Guard the change with workflow.GetVersion
// instead of re-recording.
func TestReplayHistories(t *testing.T) {
	for _, f := range histories(t) {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			r := replayer(t, workflows.SandboxWorkflow, workflows.PublishWorkflow)
			require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(testLogger(t), f))
		})
	}
}

// TestReplayDetectsChangedWorkflow keeps TestReplayHistories honest: a
// sandbox workflow that schedules a different first activity must fail to
// replay the recorded sandbox histories.
func TestReplayDetectsChangedWorkflow(t *testing.T) {
	changed := func(ctx workflow.Context, in workflows.SandboxInput) (workflows.SandboxResult, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
		err := workflow.ExecuteActivity(ctx, "InspectImage", in.Spec.Image).Get(ctx, nil)
		return workflows.SandboxResult{}, err
	}
	n := 0
	for _, f := range histories(t) {
		if !strings.HasPrefix(filepath.Base(f), "sandbox-") {
			continue
		}
		n++
		// The expected failure logs a workflow panic with its stack: discard it.
		quiet := sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))
		err := replayer(t, changed, workflows.PublishWorkflow).ReplayWorkflowHistoryFromJSONFile(quiet, f)
		// TMPRL1100 is the SDK's code for non-determinism errors.
		require.ErrorContains(t, err, "TMPRL1100", f)
	}
	require.NotZero(t, n, "no sandbox histories")
}
