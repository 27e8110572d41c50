package sandboxinit

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// mountWorkspace mounts a session's /workspace: an overlay of the leased
// layers (newest first) under the session's upper dir. It uses the new mount
// API with one "lowerdir+" per layer, so stack depth is not limited by the
// size of a mount option string, and falls back to the legacy option string
// on kernels without lowerdir+ (before 6.8). redirect_dir and metacopy stay
// off so the upper dir always holds whole files and plain directories, which
// is what capture reads.
func mountWorkspace(lower []string, upper, work, target string) error {
	if len(lower) == 0 {
		return errors.New("mount workspace: no layers")
	}
	err := mountOverlayAPI(lower, upper, work, target)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("mount workspace at %s: %w", target, err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off,index=off,xino=off",
		strings.Join(lower, ":"), upper, work)
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount workspace at %s (legacy options): %w", target, err)
	}
	return nil
}

func mountOverlayAPI(lower []string, upper, work, target string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	set := func(k, v string) error { return unix.FsconfigSetString(fd, k, v) }
	for _, l := range lower {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	for k, v := range map[string]string{"upperdir": upper, "workdir": work, "redirect_dir": "off", "metacopy": "off", "index": "off", "xino": "off"} {
		if err := set(k, v); err != nil {
			return fmt.Errorf("overlay option %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return err
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	return unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// anchorWorkspace mounts on target, a session's merged dir, its anchor: an
// empty, read-only tmpfs of a few KiB in a peer group of its own, the
// parent of the session's overlay. The session's /workspace is a slave of
// it (the runtime binds Workspace rslave), so the overlay the daemon
// mounts on target once the session runs, and one it mounts in that one's
// place later (rehead, a move in place), reach the session's mount
// namespace; nothing the session does reaches back. Between two overlays
// the workspace is the empty anchor, where nothing can be written, and the
// session's mount table names no path of the host (a bind of the state
// volume would). target must not be a mount point yet.
func anchorWorkspace(target string) error {
	if err := unix.Mount("eos-anchor", target, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=4,mode=0755"); err != nil {
		return fmt.Errorf("anchor workspace %s: %w", target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_SHARED, ""); err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("anchor workspace %s: make it shared: %w", target, err)
	}
	return nil
}

// workspaceMounted reports whether an overlay is mounted at target (an
// anchor alone is not a workspace).
func workspaceMounted(target string) bool {
	var st unix.Statfs_t
	return unix.Statfs(target, &st) == nil && st.Type == unix.OVERLAYFS_SUPER_MAGIC
}

// unmountWorkspace unmounts the overlay at target and leaves its anchor:
// the unmount reaches the session's /workspace too, which then shows the
// empty anchor until the next overlay is mounted. It fails (EBUSY) while a
// process has a file or directory of it open, in the daemon or the session.
func unmountWorkspace(target string) error {
	if !workspaceMounted(target) {
		return nil
	}
	if err := unix.Unmount(target, 0); err != nil {
		return fmt.Errorf("unmount workspace %s: %w", target, err)
	}
	return nil
}

// unmountAll peels every mount stacked on target.
//
// umount(2) itself says when target is no longer a mount point (EINVAL),
// so no mountinfo is read: with many sessions that file is long, and
// reading it per unmount made session teardown quadratic (measured: a
// fifth of the daemon's CPU with 50 agents).
func unmountAll(target string) error {
	for i := 0; i < 16; i++ {
		if err := unix.Unmount(target, 0); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				return nil
			}
			if errors.Is(err, unix.EBUSY) {
				// A process still has it open: detach so it goes when they do.
				return unix.Unmount(target, unix.MNT_DETACH)
			}
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	return nil
}
