package layerstack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Overlay format on disk. A layer (and a session's upper dir) is a plain
// directory tree in which a deletion is a whiteout and a directory that hides
// everything below it is opaque. We write whiteouts as character devices 0:0
// (what the kernel itself writes, valid for lowerdirs with and without the
// userxattr option) and fall back to an empty file carrying the whiteout
// xattrs when mknod is not permitted. Opaque directories carry both the
// trusted. and user. xattrs so the layer works whichever option mounts it.

const (
	xattrTrustedOpaque   = "trusted.overlay.opaque"
	xattrUserOpaque      = "user.overlay.opaque"
	xattrTrustedWhiteout = "trusted.overlay.whiteout"
	xattrUserWhiteout    = "user.overlay.whiteout"
	xattrTrustedRedirect = "trusted.overlay.redirect"
	xattrUserRedirect    = "user.overlay.redirect"
	xattrTrustedMetacopy = "trusted.overlay.metacopy"
	xattrUserMetacopy    = "user.overlay.metacopy"
)

// kind is what a path is inside one layer or in the merged view.
type kind uint8

const (
	kindAbsent kind = iota
	kindFile
	kindDir
	kindSymlink
	kindWhiteout
	kindOther // fifo, socket, device: never stored
)

func (k kind) String() string {
	return [...]string{"absent", "file", "directory", "symlink", "whiteout", "special"}[k]
}

// layerEntry is one lstat'ed entry of a layer directory.
type layerEntry struct {
	kind   kind
	opaque bool // directories only
	info   fs.FileInfo
}

// statLayer classifies full (a path inside a layer or upper dir).
func statLayer(full string) (layerEntry, error) {
	fi, err := os.Lstat(full)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return layerEntry{kind: kindAbsent}, nil
		}
		return layerEntry{}, err
	}
	return classify(full, fi)
}

func classify(full string, fi fs.FileInfo) (layerEntry, error) {
	e := layerEntry{info: fi}
	m := fi.Mode()
	switch {
	case m.IsRegular():
		e.kind = kindFile
		if fi.Size() == 0 {
			wh, err := hasXattr(full, xattrTrustedWhiteout, xattrUserWhiteout)
			if err != nil {
				return e, err
			}
			if wh {
				e.kind = kindWhiteout
			}
		}
	case m.IsDir():
		e.kind = kindDir
		op, err := xattrIsY(full, xattrTrustedOpaque, xattrUserOpaque)
		if err != nil {
			return e, err
		}
		e.opaque = op
	case m&fs.ModeSymlink != 0:
		e.kind = kindSymlink
	case m&fs.ModeCharDevice != 0 && m&fs.ModeDevice != 0:
		e.kind = kindOther
		if rdevOf(fi) == 0 {
			e.kind = kindWhiteout
		}
	default:
		e.kind = kindOther
	}
	return e, nil
}

func hasXattr(full string, names ...string) (bool, error) {
	for _, n := range names {
		sz, err := unix.Lgetxattr(full, n, nil)
		if err == nil && sz >= 0 {
			return true, nil
		}
		if err != nil && !isNoXattr(err) {
			return false, fmt.Errorf("read xattr %s of %s: %w", n, full, err)
		}
	}
	return false, nil
}

func xattrIsY(full string, names ...string) (bool, error) {
	var buf [8]byte
	for _, n := range names {
		sz, err := unix.Lgetxattr(full, n, buf[:])
		if err == nil && sz >= 1 && (buf[0] == 'y' || buf[0] == 'x') {
			return true, nil
		}
		if err != nil && !isNoXattr(err) {
			return false, fmt.Errorf("read xattr %s of %s: %w", n, full, err)
		}
	}
	return false, nil
}

func isNoXattr(err error) bool {
	return errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.ERANGE)
}

// writeWhiteout creates a whiteout at full.
func writeWhiteout(full string) error {
	err := unix.Mknod(full, unix.S_IFCHR, 0)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) {
		return fmt.Errorf("whiteout %s: %w", full, err)
	}
	f, ferr := os.OpenFile(full, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o000)
	if ferr != nil {
		return fmt.Errorf("whiteout %s: %w", full, ferr)
	}
	f.Close()
	_ = unix.Lsetxattr(full, xattrTrustedWhiteout, []byte("y"), 0)
	if err := unix.Lsetxattr(full, xattrUserWhiteout, []byte("y"), 0); err != nil {
		return fmt.Errorf("whiteout xattr %s: %w", full, err)
	}
	return nil
}

// markOpaque makes the directory full opaque.
func markOpaque(full string) error {
	terr := unix.Lsetxattr(full, xattrTrustedOpaque, []byte("y"), 0)
	uerr := unix.Lsetxattr(full, xattrUserOpaque, []byte("y"), 0)
	if terr != nil && uerr != nil {
		return fmt.Errorf("mark %s opaque: %w", full, uerr)
	}
	return nil
}

// checkNoRedirect refuses an upper directory the kernel wrote with a redirect
// or metacopy xattr: its content lives elsewhere, so a plain walk would
// capture it wrongly. Sessions mount with redirect_dir and metacopy off.
func checkNoRedirect(full string) error {
	for _, n := range []string{xattrTrustedRedirect, xattrUserRedirect, xattrTrustedMetacopy, xattrUserMetacopy} {
		if ok, err := hasXattr(full, n); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("%s carries %s: mount sessions with redirect_dir=off,metacopy=off", full, n)
		}
	}
	return nil
}

// removeAll deletes a tree without following symlinks (os.RemoveAll never
// follows them) and first makes read-only directories writable.
func removeAll(p string) error {
	err := os.RemoveAll(p)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, werr error) error {
		if werr == nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

// fullPath joins a clean workspace path onto a layer directory.
func fullPath(dir, p string) string {
	if p == "" {
		return dir
	}
	return dir + "/" + p
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}
