package sandboxinit

import (
	"errors"
	"io/fs"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
)

// missingInSession reports whether program does not resolve in the
// session's own root (its init's /proc/<pid>/root), its symlinks resolved
// inside that root as the session would. False when that cannot be told:
// the start's own error then stands.
func missingInSession(rs *runtime.Session, program string) bool {
	if rs == nil {
		return false
	}
	pid, err := rs.InitPid()
	if err != nil || pid <= 0 {
		return false
	}
	root, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, program, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err == nil {
		unix.Close(fd)
		return false
	}
	return errors.Is(err, fs.ErrNotExist)
}
