package runtime

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"golang.org/x/sys/unix"
)

const cgroupRoot = "/sys/fs/cgroup"

// cgroupSetup is what prepareCgroups learned about the cgroup hierarchy.
type cgroupSetup struct {
	v2   bool
	swap bool // the kernel accounts swap for the session's memory cgroup
}

// prepareCgroups makes the session cgroups writable and proves it by creating,
// limiting and removing a throwaway session cgroup.
//
// Docker mounts /sys/fs/cgroup read-only even with CAP_SYS_ADMIN; remounting
// each cgroup mount read-write is allowed (and permitted by the default
// seccomp profile). On v2, the daemon first moves itself into a "daemon" leaf
// so that its own cgroup can delegate controllers to "sessions".
func prepareCgroups() (cgroupSetup, error) {
	setup := cgroupSetup{v2: cgroups.IsCgroup2UnifiedMode()}
	if err := remountCgroupsRW(); err != nil {
		return setup, err
	}
	if setup.v2 {
		if err := delegateV2(); err != nil {
			return setup, err
		}
		setup.swap = true // fs2 ignores memory.swap.max where swap is off
	} else {
		_, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
		setup.swap = err == nil
	}
	return setup, probeCgroup()
}

// remountCgroupsRW remounts every read-only cgroup mount read-write.
func remountCgroupsRW() error {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	for _, m := range mounts {
		if m.Mountpoint != cgroupRoot && !strings.HasPrefix(m.Mountpoint, cgroupRoot+"/") {
			continue
		}
		if !hasOption(m.Options, "ro") {
			continue
		}
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := unix.Mount("", m.Mountpoint, "", flags, ""); err != nil {
			return fmt.Errorf("%w: remount %s read-write (needs CAP_SYS_ADMIN): %v", ErrUnsupported, m.Mountpoint, err)
		}
	}
	return nil
}

func hasOption(opts, want string) bool {
	return slices.Contains(strings.Split(opts, ","), want)
}

// delegateV2 moves every process of the daemon's cgroup into a "daemon"
// leaf, enables the controllers sessions need in the daemon's cgroup and in
// "sessions", and creates "sessions". libcontainer resolves the relative
// "sessions/<id>" next to the caller's leaf (the parent of its own cgroup).
// Idempotent: after a daemon restart the daemon is already in the leaf.
func delegateV2() error {
	own, err := ownCgroupV2()
	if err != nil {
		return err
	}
	parent := filepath.Join(cgroupRoot, own)
	if filepath.Base(own) != "daemon" {
		leaf := filepath.Join(parent, "daemon")
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: create cgroup %s: %v", ErrUnsupported, leaf, err)
		}
		if err := moveProcs(parent, leaf); err != nil {
			return err
		}
	} else {
		parent = filepath.Dir(parent)
	}
	sessions := filepath.Join(parent, "sessions")
	if err := os.Mkdir(sessions, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w: create cgroup %s: %v", ErrUnsupported, sessions, err)
	}
	for _, dir := range []string{parent, sessions} {
		if err := enableControllers(dir); err != nil {
			return err
		}
	}
	return nil
}

func ownCgroupV2() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: no cgroup v2 entry in /proc/self/cgroup", ErrUnsupported)
}

// moveProcs moves every process listed in from into to. Processes may exit
// meanwhile; repeat until from is empty.
func moveProcs(from, to string) error {
	for range 10 {
		b, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("read %s/cgroup.procs: %w", from, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		moved := 0
		for sc.Scan() {
			pid := strings.TrimSpace(sc.Text())
			if pid == "" {
				continue
			}
			err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(pid), 0)
			if err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("%w: move pid %s to %s: %v", ErrUnsupported, pid, to, err)
			}
			moved++
		}
		if moved == 0 {
			return nil
		}
	}
	return fmt.Errorf("%w: cgroup %s keeps gaining processes", ErrUnsupported, from)
}

// enableControllers turns on pids, memory and cpu (those available) for
// dir's children.
func enableControllers(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read %s/cgroup.controllers: %w", dir, err)
	}
	avail := strings.Fields(string(b))
	var want []string
	var missing []string
	for _, c := range []string{"pids", "memory", "cpu"} {
		if slices.Contains(avail, c) {
			want = append(want, "+"+c)
		} else {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: cgroup controllers %v not delegated to %s (available: %v)", ErrUnsupported, missing, dir, avail)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(want, " ")), 0); err != nil {
		return fmt.Errorf("%w: enable controllers in %s: %v", ErrUnsupported, dir, err)
	}
	return nil
}

// probeCgroup creates a session-shaped cgroup, writes a limit and removes it,
// with the same path resolution libcontainer uses for real sessions.
func probeCgroup() error {
	limit := int64(DefaultPidsMax)
	cg := &cgroups.Cgroup{
		Parent:    "sessions",
		Name:      "eos-probe-" + strconv.Itoa(os.Getpid()),
		Resources: &cgroups.Resources{PidsLimit: &limit, SkipDevices: true},
	}
	m, err := manager.New(cg)
	if err != nil {
		return fmt.Errorf("%w: cgroup manager: %v", ErrUnsupported, err)
	}
	defer func() { _ = m.Destroy() }()
	if err := m.Apply(-1); err != nil {
		return fmt.Errorf("%w: create session cgroup (is /sys/fs/cgroup writable?): %v", ErrUnsupported, err)
	}
	if err := m.Set(cg.Resources); err != nil {
		return fmt.Errorf("%w: write pids.max in a session cgroup: %v", ErrUnsupported, err)
	}
	return nil
}
