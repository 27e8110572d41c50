package activities

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/volume"
	"github.com/stretchr/testify/require"
)

func daemonVolumeOf(t *testing.T, d *fakeDocker, sandboxID string) string {
	t.Helper()
	c := d.containers["eos-sbx-"+sandboxID]
	require.NotNil(t, c)
	return c.Config.Labels[LabelDaemonVolume]
}

// A daemon upgrade makes a new volume: the running sandbox keeps its
// build's volume (mounted read-only), a new sandbox mounts the new one, and
// the old one goes with the last sandbox that used it. The current build's
// volume stays for the next sandbox.
func TestDaemonVolumePerBuild(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	_, err := acts.CreateContainer(ctx, testSpec("old"))
	require.NoError(t, err)
	oldVol := daemonVolumeOf(t, d, "old")
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[oldVol]["sandbox-daemon"]))

	// The same build again: the same volume, not filled again.
	fills := len(d.copies)
	_, err = acts.CreateContainer(ctx, testSpec("same"))
	require.NoError(t, err)
	require.Equal(t, oldVol, daemonVolumeOf(t, d, "same"))
	require.Len(t, d.copies, fills, "nothing is copied: the token's digest is an argument")

	// Removed behind the worker's back (docker volume prune): made and
	// filled again, never mounted empty.
	require.NoError(t, d.VolumeRemove(ctx, oldVol, true))
	_, err = acts.CreateContainer(ctx, testSpec("again"))
	require.NoError(t, err)
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[oldVol]["sandbox-daemon"]))
	require.NoError(t, acts.RemoveSandbox(ctx, "again"))

	// Upgrade: new contents (and a session init next to it).
	later := time.Now().Add(time.Minute)
	require.NoError(t, os.WriteFile(acts.cfg.DaemonBinary, fakeBuild("#!daemon v2"), 0o755))
	require.NoError(t, os.Chtimes(acts.cfg.DaemonBinary, later, later))
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(acts.cfg.DaemonBinary), "sandbox-sessinit"), fakeBuild("#!sessinit"), 0o755))
	_, err = acts.CreateContainer(ctx, testSpec("new"))
	require.NoError(t, err)
	newVol := daemonVolumeOf(t, d, "new")
	require.NotEqual(t, oldVol, newVol)
	require.Equal(t, string(fakeBuild("#!daemon v2")), string(d.volData[newVol]["sandbox-daemon"]))
	require.Equal(t, string(fakeBuild("#!sessinit")), string(d.volData[newVol]["sandbox-sessinit"]))
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[oldVol]["sandbox-daemon"]), "the old build is untouched")

	require.NoError(t, acts.RemoveSandbox(ctx, "old"))
	require.Contains(t, d.volumes, oldVol, "still used by sandbox same")
	require.NoError(t, acts.RemoveSandbox(ctx, "same"))
	require.NotContains(t, d.volumes, oldVol, "the old build's volume went with its last sandbox")
	require.NoError(t, acts.RemoveSandbox(ctx, "new"))
	require.Contains(t, d.volumes, newVol, "the current build's volume stays")
	for name := range d.containers {
		require.False(t, strings.HasPrefix(name, daemonFillPrefix), "helper %s left", name)
	}
}

// A volume of the right name whose files are wrong (a crash while filling,
// a power loss) is refilled; one of that name that is not ours is refused.
func TestDaemonVolumeRefilledOrRefused(t *testing.T) {
	d, acts, ctx, b, name := daemonVolumeFixture(t)
	var err error
	_, err = d.VolumeCreate(ctx, volume.CreateOptions{Name: name, Labels: map[string]string{LabelRole: roleDaemon, LabelDaemonSHA256: b.sha}})
	require.NoError(t, err)
	d.volData[name] = map[string][]byte{"sandbox-daemon": []byte("#!daem")} // cut short
	_, err = acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[name]["sandbox-daemon"]))

	d2 := newFakeDocker()
	acts2 := newTestActivities(t, d2)
	_, err = d2.VolumeCreate(ctx, volume.CreateOptions{Name: name, Labels: map[string]string{"someone": "else"}})
	require.NoError(t, err)
	_, err = acts2.CreateContainer(ctx, testSpec("sbx1"))
	requireAppError(t, err, "invalid_request", true)
	require.Empty(t, d2.volData[name], "a foreign volume is not written")
}

// A stopped container made before daemon volumes (the binary in its own
// file system) keeps working when adopted: it gets the binary copied again.
func TestAdoptedContainerWithoutDaemonVolume(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	spec := testSpec("sbx1")
	_, err := acts.CreateVolume(ctx, spec)
	require.NoError(t, err)
	cfg, hc := acts.containerConfig(spec, "{}", "")
	hc.Mounts = hc.Mounts[:1] // the state volume only, as before
	delete(cfg.Labels, LabelDaemonVolume)
	res, err := d.ContainerCreate(ctx, cfg, hc, nil, nil, "eos-sbx-sbx1")
	require.NoError(t, err)
	info, err := acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	require.True(t, info.Adopted)
	copies := copiesTo(d, res.ID)
	require.Len(t, copies, 1)
	entries, _, err := readTar(copies[0].data)
	require.NoError(t, err)
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(entries[strings.TrimPrefix(DaemonPath, "/")].data))
	require.Contains(t, entries, "eos/secret/daemon.token")
}

// Another build's worker may remove this build's volume, unused, between
// the create's check and its container create; Docker then makes the
// mounted name again, empty and without labels. The create sees it, makes
// and fills the volume again, and its container mounts the full one.
func TestDaemonVolumeRemovedUnderTheCreate(t *testing.T) {
	d, acts, ctx, _, name := daemonVolumeFixture(t)
	var err error
	_, err = acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.NoError(t, acts.RemoveSandbox(ctx, "sbx1"))

	removed := 0
	d.beforeCreate = func(container string) {
		if container == "eos-sbx-sbx2" && removed == 0 {
			removed++
			require.NoError(t, d.VolumeRemove(ctx, name, false), "unused: another build's sweep may remove it")
		}
	}
	_, err = acts.CreateContainer(ctx, testSpec("sbx2"))
	require.NoError(t, err)
	require.Equal(t, 1, removed)
	v := d.volumes[name]
	require.Equal(t, roleDaemon, v.Labels[LabelRole], "the volume is ours again, not Docker's empty one")
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[name]["sandbox-daemon"]))
	require.Equal(t, name, daemonVolumeOf(t, d, "sbx2"))
}

// A volume of this build's name without labels is Docker's empty one: it
// is replaced and filled, unless a container still holds it (refused,
// naming the volume, the deployment's matter).
func TestUnlabelledDaemonVolumeReplaced(t *testing.T) {
	d, acts, ctx, _, name := daemonVolumeFixture(t)
	var err error
	_, err = d.VolumeCreate(ctx, volume.CreateOptions{Name: name})
	require.NoError(t, err)
	_, err = acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.Equal(t, roleDaemon, d.volumes[name].Labels[LabelRole])
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[name]["sandbox-daemon"]))

	d2 := newFakeDocker()
	acts2 := newTestActivities(t, d2)
	cfg, hc := acts2.containerConfig(testSpec("other"), "{}", name) // makes it, as Docker does
	_, err = d2.ContainerCreate(ctx, cfg, hc, nil, nil, "someone-else")
	require.NoError(t, err)
	_, err = acts2.CreateContainer(ctx, testSpec("sbx1"))
	requireAppError(t, err, "operation_failed", true)
	require.Contains(t, err.Error(), name)
	require.Empty(t, d2.volumes[name].Labels, "left as it is")
}

// The sweep of other builds' unused volumes leaves a young one: its
// worker may be about to mount it.
func TestDaemonVolumeSweepSparesYoungVolumes(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	labels := func(sha string) map[string]string {
		return map[string]string{LabelRole: roleDaemon, LabelDaemonSHA256: sha}
	}
	young, old := daemonVolumePref+"aaaaaaaaaaaaaaaa", daemonVolumePref+"bbbbbbbbbbbbbbbb"
	d.volumes[young] = volume.Volume{Name: young, Labels: labels("aa"), CreatedAt: time.Now().Add(-time.Minute).Format(time.RFC3339)}
	d.volumes[old] = volume.Volume{Name: old, Labels: labels("bb"), CreatedAt: time.Now().Add(-time.Hour).Format(time.RFC3339)}
	_, err := acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.Contains(t, d.volumes, young)
	require.NotContains(t, d.volumes, old)
}

// Two worker processes of one build on one Docker host may fill its
// volume at once: each fills through a helper of its own name, and a
// helper is removed by another only once it is old (a crash left it).
func TestDaemonVolumeFillHelpersOfOthersStay(t *testing.T) {
	d, acts, ctx, b, name := daemonVolumeFixture(t)
	var err error
	base := daemonFillPrefix + strings.TrimPrefix(name, daemonVolumePref)
	helper := func(name string) {
		_, err := d.ContainerCreate(ctx, &container.Config{Image: "img:1", Labels: map[string]string{LabelRole: daemonFillRole, LabelDaemonVolume: daemonVolumeName(b.sha)}},
			&container.HostConfig{}, nil, nil, name)
		require.NoError(t, err)
	}
	helper(base)            // another process's fill, under way (the name an older build gave every helper)
	helper(base + "-crash") // a crash's, an hour old
	d.containers[base+"-crash"].Created = time.Now().Add(-time.Hour).Format(time.RFC3339Nano)
	_, err = acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.Contains(t, d.containers, base, "another process's fill is left alone")
	require.NotContains(t, d.containers, base+"-crash", "a crash's leftover goes")
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[name]["sandbox-daemon"]))
}

// A worker killed right after it created a sandbox's container on Docker's
// empty daemon volume (the volume removed under the create, the check
// after it never run) leaves a container that can never start and holds
// that volume: the retried create removes both, makes and fills the
// volume, and creates the container again.
func TestCreateRetriedAfterAContainerOnAnEmptyDaemonVolume(t *testing.T) {
	d, acts, ctx, _, name := daemonVolumeFixture(t)
	var err error
	spec := testSpec("sbx1")
	_, err = acts.CreateVolume(ctx, spec)
	require.NoError(t, err)
	cfg, hc := acts.containerConfig(spec, "{}", name) // Docker makes the volume, empty
	left, err := d.ContainerCreate(ctx, cfg, hc, nil, nil, "eos-sbx-sbx1")
	require.NoError(t, err)
	require.Empty(t, d.volumes[name].Labels)

	info, err := acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	require.False(t, info.Adopted, "the stuck container is not adopted")
	require.NotEqual(t, left.ID, info.ContainerID)
	require.Equal(t, roleDaemon, d.volumes[name].Labels[LabelRole])
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[name]["sandbox-daemon"]))
	require.Equal(t, name, daemonVolumeOf(t, d, "sbx1"))
}

// daemonVolumeFixture is a fake engine, activities on it, and the
// configured daemon build with its volume's name.
func daemonVolumeFixture(t *testing.T) (*fakeDocker, *Activities, context.Context, *daemonFiles, string) {
	t.Helper()
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	b, err := acts.readDaemonFiles()
	require.NoError(t, err)
	return d, acts, context.Background(), b, daemonVolumeName(b.sha)
}
