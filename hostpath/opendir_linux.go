package hostpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenDir opens the directory at path (absolute, clean: what a Policy
// returned) so that no component of it is a symlink when it is opened, and
// with create makes its missing directories (0755) the same way, one by
// one beneath the last one opened. What a Policy checked by path can
// change before it is used (another export, or any process of the host,
// puts a symlink where a directory was missing); everything written under
// the returned directory goes through it. A symlink met is *Error
// RuleSymlink, a non-directory RuleKind.
func OpenDir(arg, path string, create bool) (*os.File, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, &Error{arg, path, RuleAbsolute, "must be an absolute host path"}
	}
	how := func(flags uint64) *unix.OpenHow {
		return &unix.OpenHow{Flags: flags | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", how(unix.O_PATH))
	if err != nil {
		return nil, &Error{arg, path, RuleMissing, "open /: " + err.Error()}
	}
	for part := range strings.SplitSeq(strings.Trim(path, "/"), "/") {
		if part == "" {
			continue
		}
		next, err := unix.Openat2(fd, part, how(unix.O_PATH))
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, part, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat2(fd, part, how(unix.O_PATH))
			}
		}
		unix.Close(fd)
		if err != nil {
			return nil, openDirErr(arg, path, part, err)
		}
		fd = next
	}
	// The directory itself, readable, from what was opened (no path again).
	dir, err := unix.Openat2(fd, ".", how(unix.O_RDONLY))
	unix.Close(fd)
	if err != nil {
		return nil, openDirErr(arg, path, ".", err)
	}
	return os.NewFile(uintptr(dir), path), nil
}

func openDirErr(arg, path, part string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return &Error{arg, path, RuleSymlink, "must not contain a symlink (" + part + " is one, now); name the real path"}
	case errors.Is(err, unix.ENOTDIR):
		return &Error{arg, path, RuleKind, part + " is not a directory"}
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %w", &Error{arg, path, RuleMissing, "does not exist (" + part + ")"}, fs.ErrNotExist)
	}
	return &Error{arg, path, RuleMissing, "open " + part + ": " + err.Error()}
}
