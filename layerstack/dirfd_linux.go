package layerstack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Dir is an open directory that a session's processes may change while we
// read it (an upper dir, a mounted workspace). Every path is resolved
// beneath it by openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS: a symlink
// in any component, a ".." above it or a mount crossing is refused, so a
// directory swapped for a symlink between a check and a read can never lead
// the daemon to a file outside. Errors name the path relative to the
// directory, never where the directory lives.
type Dir struct {
	f *os.File // O_PATH|O_DIRECTORY; the finalizer closes a forgotten one
}

// ErrNotRegular means a path that was to be read is not a regular file
// (any more).
var ErrNotRegular = errors.New("not a regular file")

// ResolveBeneath are the openat2 resolve flags of every Dir lookup.
const ResolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// OpenDir opens dir (a path the daemon owns, not one a session can swap).
func OpenDir(dir string) (*Dir, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open directory: %w", err)
	}
	return &Dir{f: os.NewFile(uintptr(fd), ".")}, nil
}

// Fd is the directory's O_PATH descriptor.
func (d *Dir) Fd() int { return int(d.f.Fd()) }

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Open opens rel beneath the directory ("" or "." is the directory itself).
// The error is an *os.PathError naming rel.
func (d *Dir) Open(rel string, flags int, mode uint32) (*os.File, error) {
	if rel == "" {
		rel = "."
	}
	for {
		fd, err := unix.Openat2(d.Fd(), rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: ResolveBeneath})
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue // a concurrent rename elsewhere on the file system; retry
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: rel, Err: err}
		}
		return os.NewFile(uintptr(fd), rel), nil
	}
}

// OpenRegular opens rel for reading when it is a regular file. The file is
// first opened O_PATH (no open side effects on a device or FIFO planted in
// its place), checked by fstat, then reopened through its own descriptor,
// so what is read is the inode that was checked.
func (d *Dir) OpenRegular(rel string) (*os.File, fs.FileInfo, error) {
	p, err := d.Open(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, err
	}
	defer p.Close()
	fi, err := p.Stat()
	if err != nil {
		return nil, nil, &os.PathError{Op: "stat", Path: rel, Err: unwrapPathErr(err)}
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, &os.PathError{Op: "open", Path: rel, Err: ErrNotRegular}
	}
	return reopenRegular(p, rel, fi)
}

// reopenRegular opens the regular file p (an O_PATH descriptor) for reading.
func reopenRegular(p *os.File, rel string, fi fs.FileInfo) (*os.File, fs.FileInfo, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(p.Fd())), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), rel)
	if fi2, err := f.Stat(); err != nil || !os.SameFile(fi, fi2) {
		f.Close()
		return nil, nil, &os.PathError{Op: "open", Path: rel, Err: ErrNotRegular}
	}
	return f, fi, nil
}

// unwrapPathErr strips an *os.PathError so the caller can name its own path.
func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// OpenRegularAt opens name, an entry of the directory dirfd, for reading
// when it is a regular file, as Dir.OpenRegular does: a symlink (never
// followed), FIFO or device in its place is refused without being opened.
func OpenRegularAt(dirfd int, name string) (*os.File, fs.FileInfo, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	p := os.NewFile(uintptr(fd), name)
	defer p.Close()
	fi, err := p.Stat()
	if err != nil {
		return nil, nil, &os.PathError{Op: "stat", Path: name, Err: unwrapPathErr(err)}
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, &os.PathError{Op: "open", Path: name, Err: ErrNotRegular}
	}
	return reopenRegular(p, name, fi)
}
