package activities

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// The daemon binary (and the session init beside it) reach every sandbox
// from one read-only Docker volume per build, eos-daemon-<sha256 prefix>,
// mounted at DaemonDir, instead of a 20 MB copy into each container. The
// name is the content's hash, so a daemon upgrade makes a new volume and a
// running (or restarted) sandbox keeps the binary it started with; a
// volume no container uses any more is removed (RemoveSandbox, and the
// first create of a worker process).
const (
	DaemonDir         = "/usr/local/lib/eos" // DaemonPath and SessinitPath are in it
	daemonVolumePref  = "eos-daemon-"
	roleDaemon        = "daemon"            // LabelRole of a daemon volume
	LabelDaemonSHA256 = "eos.daemon_sha256" // the volume's content hash
	LabelDaemonVolume = "eos.daemon_volume" // on a sandbox container: the daemon volume it mounts
	daemonFillMount   = "/eos-daemon-fill"  // where the filling helper container mounts the volume
	daemonFillPrefix  = "eos-daemon-fill-"  // the helper container's name prefix
	daemonFillRole    = "daemon-fill"       // LabelRole of the helper container
	daemonFileMode    = 0o755
	// daemonVolumeGCGrace: the sweep of other builds' unused volumes
	// leaves one this young (its worker is likely between making it and
	// mounting it; the sandbox create checks for the rest).
	daemonVolumeGCGrace = 10 * time.Minute
)

// daemonFiles are the files of one daemon build, read once per content.
type daemonFiles struct {
	sha   string            // sha256 over names and contents
	files map[string][]byte // base name -> contents
}

// daemonVolumes remembers, per worker process, which daemon volumes are
// known complete and which build the configured files are.
type daemonVolumes struct {
	mu       sync.Mutex
	stamp    string // size and mtime of the daemon files last hashed
	build    *daemonFiles
	verified map[string]string // volume name -> its CreatedAt when it was last found complete
	gcDone   bool
}

// readDaemonFiles reads the daemon binary and, when built next to it, the
// session init; it rehashes only when their size or mtime changed.
func (a *Activities) readDaemonFiles() (*daemonFiles, error) {
	paths := []string{a.cfg.DaemonBinary, filepath.Join(filepath.Dir(a.cfg.DaemonBinary), filepath.Base(SessinitPath))}
	var stamp strings.Builder
	for i, p := range paths {
		fi, err := os.Stat(p)
		if i > 0 && errors.Is(err, fs.ErrNotExist) {
			continue // no session init: the daemon runs sessions' inits itself
		}
		if err != nil {
			return nil, badDaemonBuild(p, fmt.Errorf("read daemon binary: %w", err))
		}
		fmt.Fprintf(&stamp, "%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
	}
	dv := &a.dvol
	dv.mu.Lock()
	defer dv.mu.Unlock()
	if dv.build != nil && dv.stamp == stamp.String() {
		return dv.build, nil
	}
	b := &daemonFiles{files: map[string][]byte{}}
	h := sha256.New()
	for i, p := range paths {
		data, err := os.ReadFile(p)
		if i > 0 && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, badDaemonBuild(p, fmt.Errorf("read daemon binary: %w", err))
		}
		name := filepath.Base(DaemonPath)
		if i > 0 {
			name = filepath.Base(SessinitPath)
		}
		if err := checkStaticExecutable(p, data); err != nil {
			return nil, badDaemonBuild(p, err)
		}
		b.files[name] = data
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(data))
		h.Write(data)
	}
	b.sha = hex.EncodeToString(h.Sum(nil))
	dv.stamp, dv.build = stamp.String(), b
	return b, nil
}

// badDaemonBuild is a create's answer when this deployment's daemon build
// cannot be used: not the caller's request but the deployment is wrong
// (operation_failed, not retried: the operator has to replace the build).
func badDaemonBuild(path string, err error) error {
	return apperr.Newf(api.KindOperationFailed, map[string]any{"daemon_binary": path},
		"this deployment's sandbox daemon cannot be used: %v", err)
}

func daemonVolumeName(sha string) string { return daemonVolumePref + sha[:16] }

// ensureDaemonVolume returns the daemon volume of the configured build,
// creating and filling it when this worker process has not seen it
// complete. image is one present on the host (the sandbox's): the helper
// container that fills the volume is created from it, never started.
//
// own is the container the create is for: one left by a worker that
// crashed right after creating it on Docker's empty volume (below) holds
// that volume, could never start, and is removed with it.
func (a *Activities) ensureDaemonVolume(ctx context.Context, image, own string) (string, error) {
	b, err := a.readDaemonFiles()
	if err != nil {
		return "", err
	}
	name := daemonVolumeName(b.sha)
	dv := &a.dvol
	dv.mu.Lock()
	defer dv.mu.Unlock()
	// One inspect a create: a volume removed (docker volume prune) since
	// it was checked is made and filled again, never mounted empty.
	v, err := a.docker.VolumeInspect(ctx, name)
	switch {
	case cerrdefs.IsNotFound(err):
		if v, err = a.createDaemonVolume(ctx, name, b); err != nil {
			return "", err
		}
	case err != nil:
		return "", fmt.Errorf("inspect daemon volume %s: %w", name, err)
	case len(v.Labels) == 0:
		// Docker makes a volume a container mounts by a name that does not
		// exist, empty and without labels: a container was created while
		// this build's volume was missing (another build's worker removed
		// it unused). Nobody else names a volume after this build's hash:
		// it is replaced, unless a container still holds it.
		err := a.docker.VolumeRemove(ctx, name, false)
		if cerrdefs.IsConflict(err) && a.removeIfStuckOn(ctx, own, name) {
			err = a.docker.VolumeRemove(ctx, name, false)
		}
		if err != nil {
			if cerrdefs.IsConflict(err) {
				return "", apperr.Newf(api.KindOperationFailed, map[string]any{"volume": name},
					"daemon volume %s was made empty by Docker (a container mounted it while it was missing) and a container still uses it; remove that container", name)
			}
			return "", fmt.Errorf("remove unlabelled daemon volume %s: %w", name, err)
		}
		a.log.Warn("unlabelled daemon volume replaced", "volume", name)
		if v, err = a.createDaemonVolume(ctx, name, b); err != nil {
			return "", err
		}
	case v.Labels[LabelRole] != roleDaemon || v.Labels[LabelDaemonSHA256] != b.sha:
		return "", conflict("volume %s exists but is not this daemon build's volume (labels %v); remove it", name, v.Labels)
	}
	if seen, ok := dv.verified[name]; ok && seen == v.CreatedAt {
		return name, nil
	}
	if err := a.fillDaemonVolume(ctx, name, image, b); err != nil {
		return "", err
	}
	if dv.verified == nil {
		dv.verified = map[string]string{}
	}
	dv.verified[name] = v.CreatedAt
	if !dv.gcDone {
		dv.gcDone = true
		a.removeUnusedDaemonVolumes(ctx, name)
	}
	return name, nil
}

// removeIfStuckOn removes the container named own if it is not running and
// mounts the daemon volume vol, and says whether it did.
func (a *Activities) removeIfStuckOn(ctx context.Context, own, vol string) bool {
	if own == "" {
		return false
	}
	c, err := a.docker.ContainerInspect(ctx, own)
	if err != nil || (c.State != nil && (c.State.Running || c.State.Restarting)) {
		return false
	}
	for _, m := range c.Mounts {
		if m.Destination == DaemonDir && m.Name == vol {
			a.log.Warn("removing a container made on an empty daemon volume", "container", own, "volume", vol)
			return a.removeContainer(ctx, c.ID) == nil
		}
	}
	return false
}

func (a *Activities) createDaemonVolume(ctx context.Context, name string, b *daemonFiles) (volume.Volume, error) {
	v, err := a.docker.VolumeCreate(ctx, volume.CreateOptions{Name: name,
		Labels: map[string]string{LabelRole: roleDaemon, LabelDaemonSHA256: b.sha}})
	if err != nil {
		return v, fmt.Errorf("create daemon volume %s: %w", name, err)
	}
	return v, nil
}

// daemonVolumeStillVerified says whether name is still the volume this
// process found complete. A container created since mounts it, so Docker
// will not remove it now; but between the check and that create another
// build's worker may have removed it, and Docker then made an empty one.
func (a *Activities) daemonVolumeStillVerified(ctx context.Context, name string) (bool, error) {
	v, err := a.docker.VolumeInspect(ctx, name)
	if err != nil {
		return false, fmt.Errorf("inspect daemon volume %s: %w", name, err)
	}
	dv := &a.dvol
	dv.mu.Lock()
	defer dv.mu.Unlock()
	if seen, ok := dv.verified[name]; ok && seen == v.CreatedAt && v.Labels[LabelRole] == roleDaemon {
		return true, nil
	}
	delete(dv.verified, name)
	return false, nil
}

// fillDaemonVolume checks the volume's files against the build (read back
// whole: a volume a crash or power loss left short is refilled) and copies
// them in when they differ. A helper container mounts the volume for the
// Engine's archive calls; it is never started and is removed after.
func (a *Activities) fillDaemonVolume(ctx context.Context, name, image string, b *daemonFiles) error {
	// A name of its own: another worker process (of the same build, on
	// the same Docker host) may be filling the volume right now, with its
	// own helper. Helpers a crash left behind go once they are old.
	a.removeStaleFillHelpers(ctx, name)
	helper := daemonFillPrefix + strings.TrimPrefix(name, daemonVolumePref) + "-" + randHex(4)
	created, err := a.docker.ContainerCreate(ctx, &container.Config{Image: image, Entrypoint: []string{"/nonexistent"},
		Labels: map[string]string{LabelRole: daemonFillRole, LabelDaemonVolume: name}},
		&container.HostConfig{NetworkMode: "none", Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: name, Target: daemonFillMount,
			VolumeOptions: &mount.VolumeOptions{NoCopy: true}}}}, nil, nil, helper)
	if err != nil {
		return fmt.Errorf("create the container that fills daemon volume %s: %w", name, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = a.removeContainer(rctx, created.ID)
	}()
	if a.daemonVolumeMatches(ctx, created.ID, b) {
		return nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for _, n := range slices.Sorted(maps.Keys(b.files)) {
		data := b.files[n]
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: daemonFileMode, Size: int64(len(data)), ModTime: now}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	// Another worker process may fill the volume at the same time: the
	// Engine's extraction replaces each file (removed, then written
	// anew), so a read-back may catch the other's copy half written. Both
	// write the same bytes: the volume is read back until it matches, for
	// a while, and copied again if it still does not.
	for copies := 1; ; copies++ {
		if err := a.docker.CopyToContainer(ctx, created.ID, daemonFillMount, bytes.NewReader(buf.Bytes()), container.CopyToContainerOptions{}); err != nil {
			return fmt.Errorf("fill daemon volume %s: %w", name, err)
		}
		for check := 0; check < fillChecks; check++ {
			if a.daemonVolumeMatches(ctx, created.ID, b) {
				a.log.Info("daemon volume filled", "volume", name, "sha256", b.sha, "copies", copies)
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(fillCheckEvery):
			}
		}
		if copies == fillCopies {
			return fmt.Errorf("daemon volume %s does not hold the daemon build %s after filling it %d times", name, b.sha[:16], copies)
		}
	}
}

// fillChecks reads back a filled daemon volume at most this often,
// fillCheckEvery apart, before it is copied again, at most fillCopies
// times: a fill of another worker process overlapping ours settles in
// well under that.
const (
	fillChecks     = 20
	fillCheckEvery = 100 * time.Millisecond
	fillCopies     = 3
)

// randHex is n random bytes in hex.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// removeStaleFillHelpers removes the helper containers of volume name made
// over daemonVolumeGCGrace ago (a crash left them; a live fill takes
// seconds).
func (a *Activities) removeStaleFillHelpers(ctx context.Context, name string) {
	cs, err := a.docker.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelRole+"="+daemonFillRole), filters.Arg("label", LabelDaemonVolume+"="+name))})
	if err != nil {
		return
	}
	for _, c := range cs {
		if time.Since(time.Unix(c.Created, 0)) > daemonVolumeGCGrace {
			_ = a.removeContainer(ctx, c.ID)
		}
	}
}

// daemonVolumeMatches reads the volume's files back and compares them with
// the build.
func (a *Activities) daemonVolumeMatches(ctx context.Context, helper string, b *daemonFiles) bool {
	rc, _, err := a.docker.CopyFromContainer(ctx, helper, daemonFillMount+"/.")
	if err != nil {
		return false
	}
	defer rc.Close()
	got := map[string][]byte{}
	tr := tar.NewReader(io.LimitReader(rc, 1<<30))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return false
		}
		got[filepath.Base(h.Name)] = data
	}
	for n, want := range b.files {
		if !bytes.Equal(got[n], want) {
			return false
		}
	}
	return true
}

// removeUnusedDaemonVolumes removes the daemon volumes of other builds that
// no container mounts any more (Docker refuses to remove one in use, by a
// running or a stopped container: that one stays).
func (a *Activities) removeUnusedDaemonVolumes(ctx context.Context, keep string) {
	vs, err := a.docker.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelRole+"="+roleDaemon))})
	if err != nil {
		return
	}
	for _, v := range vs.Volumes {
		if v == nil || v.Name == keep || !strings.HasPrefix(v.Name, daemonVolumePref) || v.Labels[LabelRole] != roleDaemon {
			continue
		}
		if created, err := time.Parse(time.RFC3339Nano, v.CreatedAt); err == nil && time.Since(created) < daemonVolumeGCGrace {
			continue // another build's worker may be about to mount it
		}
		a.removeDaemonVolumeIfUnused(ctx, v.Name, keep)
	}
}

// currentDaemonVolume is the configured build's daemon volume name ("" if
// the build cannot be read).
func (a *Activities) currentDaemonVolume() string {
	b, err := a.readDaemonFiles()
	if err != nil {
		return ""
	}
	return daemonVolumeName(b.sha)
}

// removeDaemonVolumeIfUnused removes an old build's daemon volume unless a
// container still uses it; current (the configured build's, which the next
// sandbox mounts) stays.
func (a *Activities) removeDaemonVolumeIfUnused(ctx context.Context, name, current string) {
	if name == current || current == "" {
		return
	}
	err := a.docker.VolumeRemove(ctx, name, false)
	switch {
	case err == nil:
		a.log.Info("unused daemon volume removed", "volume", name)
	case cerrdefs.IsNotFound(err), cerrdefs.IsConflict(err):
	default:
		a.log.Warn("remove daemon volume", "volume", name, "err", err)
	}
}
