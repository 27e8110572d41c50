package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// rootDirs are the paths of a session's root overlay under SessionSpec.Dir.
type rootDirs struct{ upper, work, merged string }

func rootDirsOf(dir string) rootDirs {
	r := filepath.Join(dir, "root")
	return rootDirs{upper: filepath.Join(r, "upper"), work: filepath.Join(r, "work"), merged: filepath.Join(r, "merged")}
}

// mountRoot mounts the session's root overlay (lowerdir=/) unless it is
// already mounted (a daemon restart keeps the sandbox's mounts).
func mountRoot(d rootDirs) error {
	for _, p := range []string{d.upper, d.work, d.merged} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.upper, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", d.upper, err)
	}
	if st.Type == unix.OVERLAYFS_SUPER_MAGIC {
		return fmt.Errorf("%w: session dir %s is on an overlay file system; put it on the state volume", ErrUnsupported, d.upper)
	}
	if mounted, err := mountinfo.Mounted(d.merged); err != nil {
		return fmt.Errorf("check mount %s: %w", d.merged, err)
	} else if mounted {
		return nil
	}
	data := "lowerdir=/,upperdir=" + d.upper + ",workdir=" + d.work
	if err := unix.Mount("overlay", d.merged, "overlay", 0, data); err != nil {
		return fmt.Errorf("mount root overlay %s (%s): %w", d.merged, data, err)
	}
	return nil
}

// unmountRoot unmounts the root overlay; a missing mount is not an error.
func unmountRoot(d rootDirs) error {
	err := unix.Unmount(d.merged, 0)
	if errors.Is(err, unix.EBUSY) {
		// Something (a lingering process with its cwd there) still uses it;
		// detach so the next Start can mount afresh.
		err = unix.Unmount(d.merged, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unmount %s: %w", d.merged, err)
	}
	if err := os.Remove(d.merged); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", d.merged, err)
	}
	return nil
}

// writeEtc gives a new session its own /etc/hostname, /etc/hosts and
// /etc/resolv.conf (resolv: sessionResolvConf). The sandbox's versions are Docker bind mounts, which an
// overlay with lowerdir=/ does not see. Files the session already has in its
// upper dir (its own edits, or an earlier start) are left alone.
//
// The root overlay is the session's: a restarted session's /etc may be
// whatever it made it. So everything goes by descriptors beneath the
// merged and upper dirs with no symlink followed (layerstack.Dir), and a
// session whose /etc is not a plain directory (a symlink to /eos, to
// another session's dir) gets nothing written.
func writeEtc(d rootDirs, id, addr string, resolv []byte) error {
	if addr == "" {
		addr = "127.0.1.1"
	}
	files := map[string][]byte{
		"hostname":    []byte(id + "\n"),
		"hosts":       []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + addr + "\t" + id + "\n"),
		"resolv.conf": resolv,
	}
	merged, err := layerstack.OpenDir(d.merged)
	if err != nil {
		return fmt.Errorf("open root overlay: %w", err)
	}
	defer merged.Close()
	upper, err := layerstack.OpenDir(d.upper)
	if err != nil {
		return fmt.Errorf("open root upper dir: %w", err)
	}
	defer upper.Close()
	own, err := upper.Open("etc", unix.O_PATH|unix.O_DIRECTORY, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		own = nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return nil // the session replaced its /etc
	case err != nil:
		return fmt.Errorf("open the session's own /etc: %w", err)
	}
	if own != nil {
		defer own.Close()
	}
	etc, err := merged.Open("etc", unix.O_PATH|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(merged.Fd(), "etc", 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create /etc: %w", err)
		}
		etc, err = merged.Open("etc", unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open /etc: %w", err)
	}
	defer etc.Close()
	efd := int(etc.Fd())
	for name, content := range files {
		var st unix.Stat_t
		if own != nil && unix.Fstatat(int(own.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			continue
		}
		// Remove first: the lower's file may be a symlink (resolv.conf often
		// is); the new file is created, never opened through a link.
		_ = unix.Unlinkat(efd, name, 0)
		fd, err := unix.Openat(efd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return fmt.Errorf("write /etc/%s: %w", name, err)
		}
		f := os.NewFile(uintptr(fd), name)
		_, err = f.Write(content)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write /etc/%s: %w", name, err)
		}
	}
	return nil
}

// splitHidden sorts hidden paths into directories (masked by a tmpfs) and
// everything else (masked by /dev/null), by what they are in the sandbox.
// A path that does not exist is masked as a directory.
func splitHidden(paths []string) (dirs, files []string) {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err == nil && !fi.IsDir() {
			files = append(files, p)
			continue
		}
		dirs = append(dirs, p)
	}
	return dirs, files
}

// hasPathPrefix reports whether p is prefix or under it.
func hasPathPrefix(p, prefix string) bool {
	return p == prefix || strings.HasPrefix(p, strings.TrimSuffix(prefix, "/")+"/")
}
