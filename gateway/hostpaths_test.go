package gateway

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
)

// noTemporal is a Temporal client every call of which fails the test:
// a refused request must not reach Temporal at all.
type noTemporal struct{ tclient.Client }

// TestHostPathsRefusedBeforeAnyWorkflow: create_sandbox and export_changes
// with a host path the rule refuses are invalid_request naming the rule,
// and no Temporal call is made (no workflow starts, nothing is written).
func TestHostPathsRefusedBeforeAnyWorkflow(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	outside := t.TempDir()
	require.NoError(t, os.Symlink(allowed, filepath.Join(outside, "link")))
	inLink := filepath.Join(allowed, "link")
	require.NoError(t, os.Symlink(outside, inLink))
	pol, err := hostpath.New([]string{allowed})
	require.NoError(t, err)
	s := New(&TemporalBackend{Client: &noTemporal{}, HostPaths: pol}, testToken, nil)

	for _, tc := range []struct{ root, rule string }{
		{"/", hostpath.RuleSystem}, {"/etc", hostpath.RuleSystem}, {inLink, hostpath.RuleSymlink},
		{filepath.Join(outside, "link"), hostpath.RuleSymlink}, {outside, hostpath.RuleRoots}, {"rel/dir", hostpath.RuleAbsolute},
	} {
		_, aerr := s.Dispatch(context.Background(), &jsonl.Request{Op: "create_sandbox", Scope: jsonl.SystemScope(),
			Args: map[string]any{"image": "eos-test-busybox:1", "workspace_root": tc.root}})
		require.NotNil(t, aerr, tc.root)
		require.Equal(t, api.KindInvalidRequest, aerr.Kind, "%s: %v", tc.root, aerr)
		require.Equal(t, tc.rule, aerr.Details["rule"], "%s: %v", tc.root, aerr)
		require.Contains(t, aerr.Message, "workspace_root")
	}
	for _, tc := range []struct{ dest, format, rule string }{
		{"/", "dir", hostpath.RuleSystem}, {"/etc", "dir", hostpath.RuleSystem}, {"/etc/x.tar", "tar", hostpath.RuleSystem},
		{inLink, "dir", hostpath.RuleSymlink}, {filepath.Join(inLink, "x.tar"), "tar", hostpath.RuleSymlink},
		{filepath.Join(outside, "out"), "dir", hostpath.RuleRoots}, {filepath.Join(outside, "out.tar"), "tar", hostpath.RuleRoots},
	} {
		_, aerr := s.Dispatch(context.Background(), &jsonl.Request{Op: "export_changes", Scope: jsonl.SystemScope(),
			Args: map[string]any{"sandbox_id": "eos-1", "dest": tc.dest, "format": tc.format}})
		require.NotNil(t, aerr, tc.dest)
		require.Equal(t, api.KindInvalidRequest, aerr.Kind, "%s: %v", tc.dest, aerr)
		require.Equal(t, tc.rule, aerr.Details["rule"], "%s: %v", tc.dest, aerr)
	}
	left, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Len(t, left, 1, "nothing but the test's own link outside the allowed roots")
}
