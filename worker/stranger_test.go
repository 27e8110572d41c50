package worker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestStrangerThroughTemporal: whoever holds a Temporal client (here one
// with the token, skipping the gateway and its checks) still cannot have a
// worker copy in "/", "/etc" or a symlink, nor export to them or outside
// the allowed roots: the activities refuse with ErrInvalidArgument.
func TestStrangerThroughTemporal(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	ws := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(ws, "f.txt"), []byte("x\n"), 0o644))
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(ws, link))
	invalid := func(err error) {
		t.Helper()
		var app *temporal.ApplicationError
		require.True(t, errors.As(err, &app), "%v", err)
		require.Equal(t, api.KindInvalidRequest, app.Type(), "%v", err)
	}
	for _, root := range []string{"/", "/etc", link} {
		id := "it-" + randHex(6)
		t.Cleanup(func() { _ = s.acts.RemoveSandbox(context.Background(), id) })
		run, err := s.svc.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflows.SandboxWorkflowID(id), TaskQueue: workflows.TaskQueue},
			workflows.SandboxWorkflowName, workflows.SandboxInput{HostQueue: s.svc.HostQueue,
				Spec: workflows.SandboxSpec{SandboxID: id, Image: testenv.Images[0], WorkspaceRoot: root}})
		require.NoError(t, err)
		var res workflows.SandboxResult
		invalid(run.Get(ctx, &res))
	}

	id, _ := s.create(ws)
	outside := filepath.Join(testenv.RepoRoot(), "eos-export-must-not-exist")
	for _, dest := range []string{"/", "/etc", link, outside} {
		var out map[string]any
		invalid(s.update(id, workflows.UpdateExport, &out, workflows.ExportRequest{Dest: dest}))
	}
	_, err := os.Lstat(outside)
	require.True(t, os.IsNotExist(err), "nothing was written outside the allowed roots")
}
