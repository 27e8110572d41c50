package activities

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/docker/docker/api/types/volume"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestHostPathsOfAStranger: the activities re-check every host path as if
// a stranger sent it through Temporal, whatever the gateway checked.
func TestHostPathsOfAStranger(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	outside := t.TempDir()
	ws := filepath.Join(allowed, "ws")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	require.NoError(t, os.Symlink(ws, filepath.Join(allowed, "link")))
	pol, err := hostpath.New([]string{allowed})
	require.NoError(t, err)

	fx := newExportFixture(t)
	fx.acts.cfg.HostPaths = pol
	ctx := context.Background()
	copies := len(fx.acts.docker.(*fakeDocker).copies)

	for _, root := range []string{"/", "/etc", filepath.Join(allowed, "link"), outside, "relative"} {
		_, err := fx.acts.CopyWorkspace(ctx, workflows.SandboxSpec{SandboxID: "sbx1", WorkspaceRoot: root})
		requireAppError(t, err, api.KindInvalidRequest, true)
	}
	require.Len(t, fx.acts.docker.(*fakeDocker).copies, copies, "nothing was copied")
	_, err = fx.acts.CopyWorkspace(ctx, workflows.SandboxSpec{SandboxID: "sbx1", WorkspaceRoot: ws})
	require.NoError(t, err, "the allowed workspace is copied")

	for _, tc := range []struct{ dest, format string }{
		{"/", "dir"}, {"/etc", "dir"}, {"/etc/out.tar", "tar"},
		{filepath.Join(allowed, "link"), "dir"}, {filepath.Join(allowed, "link", "out.tar"), "tar"},
		{filepath.Join(outside, "out"), "dir"}, {filepath.Join(outside, "out.tar"), "tar"},
		{filepath.Join(outside, "out.patch"), "patch"},
	} {
		_, err := fx.acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: tc.dest, Format: tc.format})
		requireAppError(t, err, api.KindInvalidRequest, true)
	}
	require.Zero(t, fx.exports.Load(), "no export was streamed")
	left, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, left, "nothing was written outside the allowed roots")
	_, err = fx.acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: filepath.Join(allowed, "out")})
	require.NoError(t, err, "an export inside the allowed roots runs")
}

// TestVolumesMustBeOurs: a shared base volume named by the caller is
// mounted only when it is one of ours.
func TestVolumesMustBeOurs(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		sb   workflows.SharedBase
	}{
		{"foreign name", workflows.SharedBase{Volume: "postgres-data"}},
		{"foreign name for a leader", workflows.SharedBase{Volume: "postgres-data", Leader: true}},
		{"another leader's base", workflows.SharedBase{Volume: workflows.BaseVolumeName("other"), Leader: true}},
		{"missing base of a follower", workflows.SharedBase{Volume: workflows.BaseVolumeName("lead1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec("sbx1")
			sb := tc.sb
			spec.SharedBase = &sb
			_, err := acts.CreateContainer(ctx, spec)
			requireAppError(t, err, api.KindInvalidRequest, true)
		})
	}
	// A volume with our name but not our labels is refused too.
	d.mu.Lock()
	d.volumes[workflows.BaseVolumeName("lead1")] = volume.Volume{Name: workflows.BaseVolumeName("lead1"), Labels: map[string]string{"someone": "else"}}
	d.mu.Unlock()
	spec := testSpec("sbx2")
	spec.SharedBase = &workflows.SharedBase{Volume: workflows.BaseVolumeName("lead1")}
	_, err := acts.CreateContainer(ctx, spec)
	requireAppError(t, err, api.KindInvalidRequest, true)

	lead := testSpec("lead2")
	lead.SharedBase = &workflows.SharedBase{Volume: workflows.BaseVolumeName("lead2"), Leader: true}
	_, err = acts.CreateContainer(ctx, lead)
	require.NoError(t, err)
	follower := testSpec("sbx3")
	follower.SharedBase = &workflows.SharedBase{Volume: workflows.BaseVolumeName("lead2")}
	_, err = acts.CreateContainer(ctx, follower)
	require.NoError(t, err, "the group's own base volume is mounted")
}
