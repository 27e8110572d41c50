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
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
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

// TestExportNeverWritesThroughALateSymlink: a dest (or its directory) that
// did not exist when it was checked and is a symlink by the time the
// export writes (another export, or any process of the host, put it there
// while the stream was read) is refused, and nothing is written where it
// points.
func TestExportNeverWritesThroughALateSymlink(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	victim := t.TempDir()
	pol, err := hostpath.New([]string{allowed})
	require.NoError(t, err)
	fx := newExportFixture(t)
	fx.acts.cfg.HostPaths = pol
	ctx := context.Background()
	for _, tc := range []struct{ format, dest, link string }{
		{"dir", "out/new", "out/new"},         // the dest itself
		{"dir", "out2/a/new", "out2/a"},       // a directory above it
		{"tar", "out3/sub/x.tar", "out3/sub"}, // a file export's directory
		{"patch", "out4/x.patch", "out4"},
	} {
		dest := filepath.Join(allowed, tc.dest)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(allowed, tc.link)), 0o755))
		fx.onExport = func() { require.NoError(t, os.Symlink(victim, filepath.Join(allowed, tc.link))) }
		_, err := fx.acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest, Format: tc.format})
		requireAppError(t, err, api.KindInvalidRequest, true)
		e, ok := apperr.From(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, hostpath.RuleSymlink, e.Details["rule"], "%s: %v", tc.dest, e)
		left, err := os.ReadDir(victim)
		require.NoError(t, err)
		require.Empty(t, left, "%s: nothing was written through the symlink", tc.dest)
	}
}

// TestListDirectoriesKeepsToThePolicy: list_workspace_directories lists
// only what may be a workspace_root: nothing outside the allowed roots, no
// system or state dir, no symlink, and no parent above a root.
func TestListDirectoriesKeepsToThePolicy(t *testing.T) {
	allowed, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	outside := t.TempDir()
	state := filepath.Join(allowed, ".ephemeral-sandbox")
	for _, d := range []string{"b", "a/deep", ".ephemeral-sandbox/temporal"} {
		require.NoError(t, os.MkdirAll(filepath.Join(allowed, d), 0o755))
	}
	require.NoError(t, os.Symlink(outside, filepath.Join(allowed, "link")))
	pol, err := hostpath.New([]string{allowed}, state)
	require.NoError(t, err)
	acts := newTestActivities(t, newFakeDocker())
	acts.cfg.HostPaths = pol
	ctx := context.Background()

	out, err := acts.ListDirectories(ctx, allowed)
	require.NoError(t, err)
	require.Nil(t, out.Parent, "the root's parent is not listable")
	require.Equal(t, []workflows.DirectoryEntry{{Name: "a", Path: filepath.Join(allowed, "a")}, {Name: "b", Path: filepath.Join(allowed, "b")}}, out.Directories)
	out, err = acts.ListDirectories(ctx, filepath.Join(allowed, "a"))
	require.NoError(t, err)
	require.Equal(t, allowed, *out.Parent)

	for _, p := range []string{outside, "/etc", "/proc", state, filepath.Join(allowed, "link"), filepath.Join(allowed, "a", "..", ".ephemeral-sandbox"), "relative"} {
		_, err := acts.ListDirectories(ctx, p)
		requireAppError(t, err, api.KindInvalidRequest, true)
	}
}
