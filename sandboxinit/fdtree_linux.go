package sandboxinit

import (
	"errors"
	"io"
	"os"
	"sort"

	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"golang.org/x/sys/unix"
)

// Walking and copying a session's tree by file descriptors: each directory
// is opened beneath its parent's descriptor with O_NOFOLLOW, so a directory
// swapped for a symlink mid-walk is never entered, and every entry is
// lstat'ed or opened relative to the directory that listed it.

// walkAt calls fn for every entry below dir (at rel, "" for the root), in
// lexical order, each directory before its contents. Symlinks are reported
// (as not regular) and never followed.
func walkAt(dir *os.File, rel string, fn func(rel string, st *unix.Stat_t) error) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	sort.Strings(names)
	dfd := int(dir.Fd())
	for _, name := range names {
		crel := name
		if rel != "" {
			crel = rel + "/" + name
		}
		var st unix.Stat_t
		if unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue // gone meanwhile
		}
		if err := fn(crel, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // swapped for something else since the stat: not entered
		}
		sub := os.NewFile(uintptr(fd), crel)
		err = walkAt(sub, crel, fn)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// copyTreeAt copies name (an entry of the directory src) to dname in the
// directory dst without following any symlink: directories are created
// (an existing one is merged into), regular files streamed from the inode
// that was checked, symlinks recreated. An existing file is not replaced
// (EEXIST); a FIFO, socket or device refuses the copy.
func copyTreeAt(src int, name string, dst int, dname string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "lstat", Path: name, Err: err}
	}
	perm := uint32(st.Mode & 0o7777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		sfd, err := unix.Openat(src, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: name, Err: err}
		}
		sd := os.NewFile(uintptr(sfd), name)
		defer sd.Close()
		if err := unix.Mkdirat(dst, dname, perm&0o777); err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mkdir", Path: dname, Err: err}
		}
		dfd, err := unix.Openat(dst, dname, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: dname, Err: err}
		}
		dd := os.NewFile(uintptr(dfd), dname)
		defer dd.Close()
		_ = unix.Fchmod(dfd, perm)
		names, err := sd.Readdirnames(-1)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := copyTreeAt(sfd, n, dfd, n); err != nil {
				return err
			}
		}
		return nil
	case unix.S_IFREG:
		in, _, err := layerstack.OpenRegularAt(src, name)
		if err != nil {
			return err
		}
		defer in.Close()
		ofd, err := unix.Openat(dst, dname, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm&0o777)
		if err != nil {
			return &os.PathError{Op: "create", Path: dname, Err: err}
		}
		out := os.NewFile(uintptr(ofd), dname)
		_, err = io.Copy(out, in)
		if err == nil {
			err = out.Chmod(os.FileMode(perm & 0o777))
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		return err
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(src, name, buf)
		if err != nil {
			return &os.PathError{Op: "readlink", Path: name, Err: err}
		}
		if err := unix.Symlinkat(string(buf[:n]), dst, dname); err != nil {
			return &os.PathError{Op: "symlink", Path: dname, Err: err}
		}
		return nil
	}
	return &os.PathError{Op: "copy", Path: name, Err: layerstack.ErrNotRegular}
}
