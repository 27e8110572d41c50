package activities

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/go-connections/nat"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

const testSeccomp = `{
  "defaultAction": "SCMP_ACT_ERRNO",
  "syscalls": [ { "names": ["read", "write"], "action": "SCMP_ACT_ALLOW" } ]
}`

func newTestActivities(t *testing.T, d Docker) *Activities {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sandbox-daemon")
	require.NoError(t, os.WriteFile(bin, fakeBuild("#!daemon binary"), 0o755))
	return New(Config{DaemonBinary: bin, SeccompProfile: testSeccomp, Secret: testSecret, WorkerID: "w1", HostPaths: testHostPaths(t)}, d)
}

// testHostPaths allows the temp dir every t.TempDir lives under.
func testHostPaths(t *testing.T) *hostpath.Policy {
	t.Helper()
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	require.NoError(t, err)
	p, err := hostpath.New([]string{tmp})
	require.NoError(t, err)
	return p
}

func testSpec(id string) workflows.SandboxSpec {
	return workflows.SandboxSpec{SandboxID: id, Image: "img:1", Labels: map[string]string{"eos.test": "unit"},
		Profile: workflows.ResourceProfile{MemoryBytes: 1 << 30, CPUs: 1.5, PidsLimit: 512}}
}

// requireAppError asserts err is a temporal ApplicationError of errType.
func requireAppError(t *testing.T, err error, errType string, nonRetryable bool) *temporal.ApplicationError {
	t.Helper()
	require.Error(t, err)
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "want ApplicationError %s, got %T: %v", errType, err, err)
	require.Equal(t, errType, appErr.Type(), "%v", err)
	require.Equal(t, nonRetryable, appErr.NonRetryable(), "%v", err)
	return appErr
}

func TestDaemonTokenDeterministic(t *testing.T) {
	a := daemonclient.Token(testSecret, "sbx1")
	require.Equal(t, a, daemonclient.Token(testSecret, "sbx1"))
	require.Len(t, a, 64)
	require.NotEqual(t, a, daemonclient.Token(testSecret, "sbx2"))
	require.NotEqual(t, a, daemonclient.Token([]byte("another secret"), "sbx1"))
	m := hmac.New(sha256.New, testSecret)
	m.Write([]byte("daemon-token/sbx1"))
	require.Equal(t, hex.EncodeToString(m.Sum(nil)), a)
}

func TestCheckImage(t *testing.T) {
	acts := newTestActivities(t, newFakeDocker())
	require.NoError(t, acts.CheckImage(context.Background(), "img:1"))

	err := acts.CheckImage(context.Background(), "missing:1")
	appErr := requireAppError(t, err, api.KindInvalidRequest, true)
	require.Contains(t, appErr.Error(), "image missing:1 is not present on this Docker host; build or load it first (no pull is attempted)")

	requireAppError(t, acts.CheckImage(context.Background(), " "), api.KindInvalidRequest, true)
	// A name that is no image reference, and one the Engine refuses, are
	// the caller's error (not retried), like a missing image.
	for _, bad := range []string{"Bad::Name", strings.Repeat("a", 600), "../etc"} {
		requireAppError(t, acts.CheckImage(context.Background(), bad), api.KindInvalidRequest, true)
	}
	appErr = requireAppError(t, acts.CheckImage(context.Background(), "UPPER/case:1"), api.KindInvalidRequest, true)
	require.Contains(t, appErr.Error(), "refused the name")
}

func TestCreateContainerFresh(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	spec := testSpec("sbx1")

	info, err := acts.CreateContainer(ctx, spec)
	require.NoError(t, err)
	require.False(t, info.Adopted)
	require.Equal(t, "eos-sbx-sbx1", info.Name)
	require.Equal(t, "eos-state-sbx1", info.Volume)
	creates := sandboxCreates(d)
	require.Len(t, creates, 1)

	// The volume exists with our labels (CreateContainer makes sure of it).
	v := d.volumes["eos-state-sbx1"]
	require.Equal(t, map[string]string{LabelManaged: "true", LabelSandboxID: "sbx1", LabelRole: "state", LabelWorker: "w1", "eos.test": "unit",
		LabelImage: "img:1"}, v.Labels)

	c := creates[0]
	require.Equal(t, "img:1", c.cfg.Image)
	require.Equal(t, []string{DaemonPath}, []string(c.cfg.Entrypoint))
	// The daemon checks tokens against the token's SHA-256, its one
	// argument: a digest, not the token (TestTokenNeverLeaks).
	sum := sha256.Sum256([]byte(daemonclient.Token(testSecret, "sbx1")))
	require.Equal(t, []string{"--token-sha256=" + hex.EncodeToString(sum[:])}, []string(c.cfg.Cmd))
	require.Empty(t, c.cfg.Env)
	dvol := c.cfg.Labels[LabelDaemonVolume]
	require.Regexp(t, `^eos-daemon-[0-9a-f]{16}$`, dvol)
	require.Equal(t, map[string]string{LabelManaged: "true", LabelSandboxID: "sbx1", LabelRole: "sandbox", LabelWorker: "w1", "eos.test": "unit",
		LabelImage: "img:1", LabelDaemonVolume: dvol}, c.cfg.Labels)
	require.Equal(t, container.RestartPolicyUnlessStopped, c.hc.RestartPolicy.Name, "back after an Engine restart or a reboot")
	require.False(t, c.hc.Privileged)
	require.Equal(t, []string{"ALL"}, []string(c.hc.CapDrop))
	require.ElementsMatch(t, sandboxCaps, []string(c.hc.CapAdd))
	require.Equal(t, []string{`seccomp={"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}`,
		"apparmor=unconfined", "label=disable"}, c.hc.SecurityOpt, "no AppArmor or SELinux profile that refuses the daemon's mounts")
	require.Equal(t, map[string]string{"net.ipv4.ip_forward": "1"}, c.hc.Sysctls)
	// Alone on a bridge network of its own, with our labels.
	require.Equal(t, "eos-net-sbx1", string(c.hc.NetworkMode))
	n := d.networks["eos-net-sbx1"]
	require.Equal(t, "bridge", n.Driver)
	require.False(t, n.Internal, "Docker publishes no ports of a container only on an internal network")
	require.Equal(t, map[string]string{LabelManaged: "true", LabelSandboxID: "sbx1", LabelRole: "network", LabelWorker: "w1", "eos.test": "unit"}, n.Labels)
	require.Equal(t, []mount.Mount{{Type: mount.TypeVolume, Source: "eos-state-sbx1", Target: "/eos"},
		{Type: mount.TypeVolume, Source: dvol, Target: DaemonDir, ReadOnly: true, VolumeOptions: &mount.VolumeOptions{NoCopy: true}}}, c.hc.Mounts)
	pb := c.hc.PortBindings["7001/tcp"]
	require.Len(t, pb, 1)
	require.Equal(t, "127.0.0.1", pb[0].HostIP)
	require.Equal(t, "", pb[0].HostPort, "an ephemeral host port")
	require.EqualValues(t, 1<<30, c.hc.Memory)
	require.EqualValues(t, 1_500_000_000, c.hc.NanoCPUs)
	require.NotNil(t, c.hc.PidsLimit)
	require.EqualValues(t, 512, *c.hc.PidsLimit)

	// The daemon binary is in the daemon volume (filled through a helper
	// container that is gone), not copied into the container.
	require.Equal(t, string(fakeBuild("#!daemon binary")), string(d.volData[dvol][filepath.Base(DaemonPath)]))
	require.Equal(t, roleDaemon, d.volumes[dvol].Labels[LabelRole])
	require.True(t, slices.ContainsFunc(d.removed, func(r string) bool {
		return strings.HasPrefix(r, "container/"+daemonFillPrefix+strings.TrimPrefix(dvol, daemonVolumePref)+"-")
	}), "the helper is removed: %v", d.removed)
	// Nothing is copied into the container before start.
	require.Empty(t, copiesTo(d, info.ContainerID))
}

// A created container adopted again (a retry, or an orphan adopted by
// another deployment) gets the token file, which the daemon prefers to its
// argument: the argument may hold another deployment's digest.
func TestAdoptedCreatedContainerGetsTheTokenFile(t *testing.T) {
	d := newFakeDocker()
	ctx := context.Background()
	_, err := newTestActivities(t, d).CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	other := newTestActivities(t, d)
	other.cfg.Secret = []byte("another deployment's secret")
	info, err := other.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.True(t, info.Adopted)
	copies := copiesTo(d, info.ContainerID)
	require.Len(t, copies, 1)
	require.Equal(t, "/", copies[0].path)
	entries, order, err := readTar(copies[0].data)
	require.NoError(t, err)
	require.Equal(t, []string{"eos/secret/", "eos/secret/daemon.token"}, order)
	tok := entries["eos/secret/daemon.token"]
	require.Equal(t, daemonclient.Token([]byte("another deployment's secret"), "sbx1"), string(tok.data))
	require.EqualValues(t, 0o600, tok.hdr.Mode)
	require.EqualValues(t, 0o700, entries["eos/secret/"].hdr.Mode)
}

// The token appears nowhere but the copied file: not in labels, env,
// argv, the create call, or the activity's output.
func TestTokenNeverLeaks(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	token := daemonclient.Token(testSecret, "sbx1")

	info, err := acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	started, err := acts.StartContainer(ctx, "sbx1")
	require.NoError(t, err)
	for _, v := range []any{d.creates[0].cfg, d.creates[0].hc, info, started, d.volumes} {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		require.NotContains(t, string(b), token)
	}
	ci := d.containers["eos-sbx-sbx1"]
	for _, s := range append(append(append([]string{}, ci.Config.Env...), ci.Config.Cmd...), ci.Config.Entrypoint...) {
		require.NotContains(t, s, token)
	}
}

func TestCreateContainerAdoptsSameImageAndLabels(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()

	first, err := acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	second, err := acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.True(t, second.Adopted)
	require.Equal(t, first.ContainerID, second.ContainerID)
	require.Len(t, sandboxCreates(d), 1, "no second create")
	require.Len(t, copiesTo(d, first.ContainerID), 1, "an adopted created container gets the token file (its argument may be another deployment's)")

	// Once running it is adopted as is, with its endpoint.
	_, err = acts.StartContainer(ctx, "sbx1")
	require.NoError(t, err)
	third, err := acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.True(t, third.Adopted)
	require.Equal(t, api.Endpoint{Host: "127.0.0.1", Port: 49153}, third.Daemon)
	require.Equal(t, "running", third.State)
	require.Len(t, copiesTo(d, first.ContainerID), 1)
}

// sandboxCreates are the creates of sandbox containers (not the helper
// that fills a daemon volume).
func sandboxCreates(d *fakeDocker) []fakeCreate {
	var out []fakeCreate
	for _, c := range d.creates {
		if !strings.HasPrefix(c.name, daemonFillPrefix) {
			out = append(out, c)
		}
	}
	return out
}

func copiesTo(d *fakeDocker, containerID string) []fakeCopy {
	var out []fakeCopy
	for _, c := range d.copies {
		if c.container == containerID {
			out = append(out, c)
		}
	}
	return out
}

func TestCreateContainerReplaces(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		image  string
	}{
		{"foreign container", map[string]string{"other": "x"}, "img:1"},
		{"another sandbox's labels", map[string]string{LabelManaged: "true", LabelSandboxID: "sbx9"}, "img:1"},
		{"different image", nil, "img:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newFakeDocker()
			acts := newTestActivities(t, d)
			ctx := context.Background()
			var old string
			if tc.labels == nil {
				info, err := acts.CreateContainer(ctx, workflows.SandboxSpec{SandboxID: "sbx1", Image: tc.image})
				require.NoError(t, err)
				old = info.ContainerID
			} else {
				res, err := d.ContainerCreate(ctx, &container.Config{Image: tc.image, Labels: tc.labels}, &container.HostConfig{}, nil, nil, "eos-sbx-sbx1")
				require.NoError(t, err)
				old = res.ID
			}
			info, err := acts.CreateContainer(ctx, testSpec("sbx1"))
			require.NoError(t, err)
			require.False(t, info.Adopted)
			require.NotEqual(t, old, info.ContainerID)
			require.Contains(t, d.removed, "container/eos-sbx-sbx1")
			require.Equal(t, "sha256:aaaa", d.containers["eos-sbx-sbx1"].Image)
		})
	}
}

func TestCreateVolume(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	name, err := acts.CreateVolume(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	again, err := acts.CreateVolume(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.Equal(t, name, again)

	// A volume of that name that is not ours is left alone.
	d.volumes["eos-state-sbx2"] = volume.Volume{Name: "eos-state-sbx2", Labels: map[string]string{"app": "db"}}
	_, err = acts.CreateVolume(ctx, testSpec("sbx2"))
	requireAppError(t, err, api.KindInvalidRequest, true)

	_, err = acts.CreateVolume(ctx, testSpec("../x"))
	requireAppError(t, err, api.KindInvalidRequest, true)
}

func TestCreateContainerNeedsConfigAndImage(t *testing.T) {
	d := newFakeDocker()
	acts := New(Config{Secret: testSecret}, d)
	_, err := acts.CreateContainer(context.Background(), testSpec("sbx1"))
	requireAppError(t, err, api.KindInvalidRequest, true)

	acts = newTestActivities(t, d)
	spec := testSpec("sbx1")
	spec.Image = "missing:1"
	_, err = acts.CreateContainer(context.Background(), spec)
	requireAppError(t, err, api.KindInvalidRequest, true)
}

func TestStartStopRemoveInspect(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()

	_, err := acts.StartContainer(ctx, "sbx1")
	requireAppError(t, err, api.KindNotFound, true)
	ins, err := acts.Inspect(ctx, "sbx1")
	require.NoError(t, err)
	require.False(t, ins.Exists)

	_, err = acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	info, err := acts.StartContainer(ctx, "sbx1")
	require.NoError(t, err)
	require.Equal(t, api.Endpoint{Host: "127.0.0.1", Port: 49153}, info.Daemon)
	info, err = acts.StartContainer(ctx, "sbx1") // running: nothing to do
	require.NoError(t, err)
	require.Equal(t, 49153, info.Daemon.Port)
	ins, err = acts.Inspect(ctx, "sbx1")
	require.NoError(t, err)
	require.True(t, ins.Exists)
	require.Equal(t, "running", ins.Container.State)

	require.NoError(t, acts.StopContainer(ctx, "sbx1"))
	require.NoError(t, acts.RemoveSandbox(ctx, "sbx1"))
	require.NoError(t, acts.RemoveSandbox(ctx, "sbx1"), "removing twice is fine")
	require.NoError(t, acts.StopContainer(ctx, "sbx1"), "stopping a missing container is fine")
	require.Empty(t, d.containers)
	require.Len(t, d.volumes, 1, "only the current daemon build's volume stays: %v", d.volumes)
	for name := range d.volumes {
		require.True(t, strings.HasPrefix(name, daemonVolumePref), name)
	}
	require.Empty(t, d.networks, "the sandbox's network goes with it")
}

func TestLeftovers(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	for _, id := range []string{"keep1", "drop1", "drop2"} {
		_, err := acts.CreateContainer(ctx, testSpec(id))
		require.NoError(t, err)
	}
	_, err := acts.CreateVolume(ctx, testSpec("orphanvol"))
	require.NoError(t, err)
	// Another worker's sandbox on the same host is not ours to list.
	other := New(Config{DaemonBinary: acts.cfg.DaemonBinary, SeccompProfile: testSeccomp, Secret: testSecret, WorkerID: "w2"}, d)
	_, err = other.CreateContainer(ctx, testSpec("elsewhere"))
	require.NoError(t, err)

	left, err := acts.ListLeftovers(ctx)
	require.NoError(t, err)
	require.Len(t, left, 10) // 3 containers, 4 volumes, 3 networks
	for _, l := range left {
		require.NotEqual(t, "elsewhere", l.SandboxID)
	}

	removed, err := acts.RemoveLeftovers(ctx, func(id string) bool { return id == "keep1" })
	require.NoError(t, err)
	require.Len(t, removed, 7)
	require.Equal(t, "container", removed[0].Kind, "containers go first")
	require.Equal(t, "volume", removed[len(removed)-1].Kind, "volumes last")
	left, err = acts.ListLeftovers(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []Leftover{
		{Kind: "container", Name: "eos-sbx-keep1", SandboxID: "keep1"},
		{Kind: "volume", Name: "eos-state-keep1", SandboxID: "keep1"},
		{Kind: "network", Name: "eos-net-keep1", SandboxID: "keep1"},
	}, left)
	ins, err := other.Inspect(ctx, "elsewhere")
	require.NoError(t, err)
	require.True(t, ins.Exists)
}

func TestListImages(t *testing.T) {
	acts := newTestActivities(t, newFakeDocker())
	imgs, err := acts.ListImages(context.Background())
	require.NoError(t, err)
	require.Len(t, imgs, 2)
	for _, im := range imgs {
		require.Len(t, im.Tags, 1, "<none>:<none> is dropped")
	}
}

func TestCopyWorkspaceTar(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	_, err := acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)

	root := t.TempDir()
	mtime := time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sub", ".git"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "a.txt"), []byte("alpha\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "sub", "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "sub", ".git", "HEAD"), []byte("ref\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, ".gitignore"), []byte("*.log\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "x.log"), []byte("ignored by git, copied anyway\n"), 0o644))
	// The modes the copy must keep, whatever the umask made of them.
	require.NoError(t, os.Chmod(filepath.Join(root, "a.txt"), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(root, "sub", "run.sh"), 0o755))
	require.NoError(t, os.Chtimes(filepath.Join(root, "a.txt"), mtime, mtime))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(root, "abs-link")))
	require.NoError(t, os.Symlink("sub", filepath.Join(root, "dir-link")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644))

	rep, err := acts.CopyWorkspace(ctx, workflows.SandboxSpec{SandboxID: "sbx1", WorkspaceRoot: root})
	require.NoError(t, err)
	require.Equal(t, workflows.CopyReport{Files: 5, Dirs: 3, Symlinks: 2, Bytes: 6 + 10 + 4 + 6 + 30, Skipped: 1, SkippedPaths: []string{"fifo"}}, rep)

	last := d.copies[len(d.copies)-1]
	require.Equal(t, "/", last.path)
	entries, order, err := readTar(last.data)
	require.NoError(t, err)
	require.Equal(t, "eos/", order[0])
	require.Equal(t, "eos/import/", order[1])
	require.Contains(t, entries, "eos/import/src/")
	a := entries["eos/import/src/a.txt"]
	require.Equal(t, "alpha\n", string(a.data))
	require.EqualValues(t, 0o644, a.hdr.Mode)
	require.True(t, a.hdr.ModTime.Equal(mtime))
	require.EqualValues(t, 0o755, entries["eos/import/src/sub/run.sh"].hdr.Mode)
	require.Contains(t, entries, "eos/import/src/sub/.git/HEAD")
	require.Contains(t, entries, "eos/import/src/x.log")
	link := entries["eos/import/src/abs-link"]
	require.EqualValues(t, '2', link.hdr.Typeflag)
	require.Equal(t, "/etc/passwd", link.hdr.Linkname)
	require.Equal(t, "sub", entries["eos/import/src/dir-link"].hdr.Linkname)
	require.NotContains(t, entries, "eos/import/src/dir-link/run.sh", "symlinks are never followed")
	require.NotContains(t, entries, "eos/import/src/fifo")

	_, err = acts.CopyWorkspace(ctx, workflows.SandboxSpec{SandboxID: "sbx1", WorkspaceRoot: "relative"})
	requireAppError(t, err, api.KindInvalidRequest, true)
	_, err = acts.CopyWorkspace(ctx, workflows.SandboxSpec{SandboxID: "sbx1", WorkspaceRoot: filepath.Join(root, "a.txt")})
	requireAppError(t, err, api.KindInvalidRequest, true)
	_, err = acts.CopyWorkspace(ctx, workflows.SandboxSpec{SandboxID: "nope", WorkspaceRoot: root})
	requireAppError(t, err, api.KindNotFound, true)
}

func TestStatsOf(t *testing.T) {
	var s container.StatsResponse
	s.CPUStats.CPUUsage.TotalUsage = 3_000
	s.PreCPUStats.CPUUsage.TotalUsage = 1_000
	s.CPUStats.SystemUsage = 20_000
	s.PreCPUStats.SystemUsage = 10_000
	s.CPUStats.OnlineCPUs = 2
	s.MemoryStats.Usage = 1000
	s.MemoryStats.Limit = 4000
	s.MemoryStats.Stats = map[string]uint64{"inactive_file": 200}
	s.PidsStats.Current = 7
	require.Equal(t, ContainerStats{CPUPercent: 40, MemoryBytes: 800, MemoryLimit: 4000, Pids: 7}, statsOf(s))
}

// The small session init goes into the container next to the daemon when
// it was built next to the daemon binary (make daemon), and is left out
// (the daemon then runs sessions' inits itself) when it was not.
func TestBootstrapTarShipsSessinit(t *testing.T) {
	dir := t.TempDir()
	daemon := filepath.Join(dir, "sandbox-daemon")
	require.NoError(t, os.WriteFile(daemon, []byte("#!daemon"), 0o755))
	tarball, err := bootstrapTar(daemon, "tok")
	require.NoError(t, err)
	entries, _, err := readTar(tarball)
	require.NoError(t, err)
	require.NotContains(t, entries, strings.TrimPrefix(SessinitPath, "/"))

	require.NoError(t, os.WriteFile(filepath.Join(dir, "sandbox-sessinit"), []byte("#!sessinit"), 0o755))
	tarball, err = bootstrapTar(daemon, "tok")
	require.NoError(t, err)
	entries, _, err = readTar(tarball)
	require.NoError(t, err)
	si := entries[strings.TrimPrefix(SessinitPath, "/")]
	require.Equal(t, "#!sessinit", string(si.data))
	require.EqualValues(t, 0o755, si.hdr.Mode)
	require.Equal(t, "#!daemon", string(entries[strings.TrimPrefix(DaemonPath, "/")].data))
}

// daemonDirect is the IP of the container's one network: none when the
// daemon's port is not published or the container is on several networks
// (which one the caller shares is not known).
func TestDaemonDirectIsTheOneNetworksIP(t *testing.T) {
	published := nat.PortMap{daemonPort: {{HostIP: "127.0.0.1", HostPort: "32768"}}}
	inspect := func(ports nat.PortMap, nets map[string]string) container.InspectResponse {
		ns := &container.NetworkSettings{Networks: map[string]*network.EndpointSettings{}}
		ns.Ports = ports
		for name, ip := range nets {
			ns.Networks[name] = &network.EndpointSettings{IPAddress: ip}
		}
		return container.InspectResponse{NetworkSettings: ns}
	}
	require.Equal(t, &api.Endpoint{Host: "172.20.0.2", Port: DaemonPort}, daemonDirect(inspect(published, map[string]string{"eos-net-x": "172.20.0.2"})))
	require.Nil(t, daemonDirect(inspect(nil, map[string]string{"eos-net-x": "172.20.0.2"})), "not published")
	require.Nil(t, daemonDirect(inspect(published, map[string]string{"a": "172.20.0.2", "b": "172.21.0.2"})), "two networks")
	require.Nil(t, daemonDirect(inspect(published, nil)), "no network")
	require.Nil(t, daemonDirect(container.InspectResponse{}), "no network settings")
}
