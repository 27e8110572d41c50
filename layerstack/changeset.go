package layerstack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// ChangeKind is what a change does to its path.
type ChangeKind string

const (
	ChangeWrite   ChangeKind = "write"      // create or replace a regular file
	ChangeDelete  ChangeKind = "delete"     // remove the path (and anything below it)
	ChangeSymlink ChangeKind = "symlink"    // create or replace a symlink
	ChangeDir     ChangeKind = "dir"        // create a directory or change its mode
	ChangeOpaque  ChangeKind = "opaque_dir" // replace a directory: nothing below it survives but this change set's entries
)

// Change is one path's change. A write's content comes from Data when
// Source is empty, else it is streamed from the file Source: a path
// relative to the directory Capture read (opened beneath it, never
// following a symlink), or an absolute path of a file the daemon owns.
type Change struct {
	Path   string      `json:"path"`
	Kind   ChangeKind  `json:"kind"`
	Mode   fs.FileMode `json:"mode,omitempty"` // permission bits of a write, dir or opaque dir
	Target string      `json:"target,omitempty"`
	Size   int64       `json:"size,omitempty"`
	Source string      `json:"-"`
	Data   []byte      `json:"-"`

	dir *Dir // what a relative Source is beneath
}

// Drop is an upper-dir entry that capture could not represent.
type Drop struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Drop reasons.
const (
	DropSpecialFile = "unsupported_special_file"
	DropInvalidPath = "invalid_layer_path"
)

// ChangeSet is a session's changes relative to its base. A captured one
// holds the captured directory open until Close.
type ChangeSet struct {
	Changes []Change `json:"changes"`
	Drops   []Drop   `json:"drops,omitempty"`

	dir *Dir
}

// Close releases the directory a captured change set reads its sources
// from. It is safe on any change set, and more than once.
func (cs *ChangeSet) Close() error {
	if cs == nil || cs.dir == nil {
		return nil
	}
	err := cs.dir.Close()
	cs.dir = nil
	return err
}

// Counts tallies the change set by kind.
func (cs *ChangeSet) Counts() Counts {
	var c Counts
	for _, ch := range cs.Changes {
		switch ch.Kind {
		case ChangeWrite:
			c.Files++
		case ChangeDelete:
			c.Deletes++
		case ChangeSymlink:
			c.Symlinks++
		case ChangeDir:
			c.Dirs++
		case ChangeOpaque:
			c.Opaques++
		}
	}
	return c
}

// Empty reports whether there is nothing to publish.
func (cs *ChangeSet) Empty() bool { return cs == nil || (len(cs.Changes) == 0 && len(cs.Drops) == 0) }

// normalize sorts the changes by path and keeps the last change per path.
func (cs *ChangeSet) normalize() []Change {
	last := map[string]int{}
	for i, c := range cs.Changes {
		last[c.Path] = i
	}
	out := make([]Change, 0, len(last))
	for i, c := range cs.Changes {
		if last[c.Path] == i {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Capture reads an overlay upper directory as a change set. Whiteouts (char
// 0:0 or the whiteout xattrs) become deletions, opaque directories become
// opaque-dir changes, the exec bit and every other permission bit ride along.
// Regular files are referenced, not read: Publish hashes what it copies.
//
// A session's processes may change the directory meanwhile (the caller
// freezes them where it can): the walk goes by file descriptors, each
// directory opened beneath its parent without following a symlink, and
// sources are opened the same way later (Change.OpenSource), so nothing
// outside upper is ever listed or read. Errors name workspace paths only.
// The caller closes the change set.
func Capture(upper string) (*ChangeSet, error) {
	d, err := OpenDir(upper)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", unwrapPathErr(err))
	}
	top, err := d.Open("", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("capture: %w", unwrapPathErr(err))
	}
	cs := &ChangeSet{dir: d}
	err = cs.captureDir(top, "")
	top.Close()
	if err != nil {
		cs.Close()
		return nil, err
	}
	return cs, nil
}

// captureDir adds the entries of dir (at rel) in lexical order, each
// directory before what is in it.
func (cs *ChangeSet) captureDir(dir *os.File, rel string) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("capture %s: %w", displayRel(rel), unwrapPathErr(err))
	}
	sort.Strings(names)
	dfd := int(dir.Fd())
	for _, name := range names {
		crel := name
		if rel != "" {
			crel = rel + "/" + name
		}
		// The entry itself, never followed; the parent is pinned by dfd.
		full := "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + name
		fi, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed while we looked
		}
		if err != nil {
			return fmt.Errorf("capture %s: %w", crel, unwrapPathErr(err))
		}
		if !utf8.ValidString(crel) {
			cs.Drops = append(cs.Drops, Drop{Path: crel, Reason: DropInvalidPath})
			continue
		}
		if fi.IsDir() {
			if err := cs.captureSubdir(dfd, name, crel); err != nil {
				return err
			}
			continue
		}
		le, err := classify(full, fi)
		if err != nil {
			return fmt.Errorf("capture %s: %w", crel, scrubProcPath(err, full, crel))
		}
		switch le.kind {
		case kindWhiteout:
			cs.Changes = append(cs.Changes, Change{Path: crel, Kind: ChangeDelete})
		case kindSymlink:
			t, err := readlinkat(dfd, name)
			if err != nil {
				return fmt.Errorf("capture %s: %w", crel, err)
			}
			cs.Changes = append(cs.Changes, Change{Path: crel, Kind: ChangeSymlink, Target: t})
		case kindFile:
			cs.Changes = append(cs.Changes, Change{Path: crel, Kind: ChangeWrite, Mode: fi.Mode().Perm(), Source: crel, Size: fi.Size(), dir: cs.dir})
		default:
			cs.Drops = append(cs.Drops, Drop{Path: crel, Reason: DropSpecialFile})
		}
	}
	return nil
}

// captureSubdir opens name beneath its parent's descriptor (a symlink
// swapped in since the listing is refused) and captures it.
func (cs *ChangeSet) captureSubdir(parent int, name, crel string) error {
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("capture %s: %w: it changed from a directory while being captured", crel, ErrNotRegular)
	}
	if err != nil {
		return fmt.Errorf("capture %s: %w", crel, err)
	}
	sub := os.NewFile(uintptr(fd), crel)
	defer sub.Close()
	fi, err := sub.Stat()
	if err != nil {
		return fmt.Errorf("capture %s: %w", crel, unwrapPathErr(err))
	}
	self := "/proc/self/fd/" + strconv.Itoa(fd) + "/."
	le, err := classify(self, fi)
	if err == nil {
		err = checkNoRedirect(self)
	}
	if err != nil {
		return fmt.Errorf("capture %s: %w", crel, scrubProcPath(err, self, crel))
	}
	k := ChangeDir
	if le.opaque {
		k = ChangeOpaque
	}
	cs.Changes = append(cs.Changes, Change{Path: crel, Kind: k, Mode: fi.Mode().Perm()})
	return cs.captureDir(sub, crel)
}

func readlinkat(dfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// scrubProcPath replaces a /proc/self/fd path in an error's text by the
// workspace path it stands for.
func scrubProcPath(err error, full, rel string) error {
	return &scrubbedError{msg: strings.ReplaceAll(err.Error(), full, rel), err: err}
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

func displayRel(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// OpenSource opens a write's source for reading, as a regular file: beneath
// the captured directory for a captured change (no symlink followed, the
// inode checked by fstat before it is read), else by its absolute path, a
// file the daemon owns. Errors name the change's path.
func (c Change) OpenSource() (*os.File, fs.FileInfo, error) {
	var (
		f   *os.File
		fi  fs.FileInfo
		err error
	)
	switch {
	case c.Source == "":
		return nil, nil, fmt.Errorf("%s: %w: the change has no source file", c.Path, ErrBadRequest)
	case filepath.IsAbs(c.Source):
		f, fi, err = openOwnRegular(c.Source)
	case c.dir == nil:
		return nil, nil, fmt.Errorf("%s: %w: a relative source without its captured directory", c.Path, ErrBadRequest)
	default:
		f, fi, err = c.dir.OpenRegular(c.Source)
	}
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: c.Path, Err: unwrapPathErr(err)}
	}
	return f, fi, nil
}

// openOwnRegular opens a daemon-owned regular file without following a
// final symlink.
func openOwnRegular(name string) (*os.File, fs.FileInfo, error) {
	fd, err := unix.Open(name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	p := os.NewFile(uintptr(fd), name)
	defer p.Close()
	fi, err := p.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, &os.PathError{Op: "open", Path: name, Err: ErrNotRegular}
	}
	return reopenRegular(p, name, fi)
}
