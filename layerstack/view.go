package layerstack

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"
)

// View is a read-only merged view through a stack of layers, with overlay
// semantics: the newest layer holding a path wins, a whiteout hides the path,
// and an opaque directory or a non-directory cuts everything below it.
type View struct {
	s     *Store
	lease *Lease // a pinned stack; nil with s set means "the head at each call"
	fixed stack  // a fixed stack (NewView)
}

// Entry describes one path in a merged view.
type Entry struct {
	Path    string      `json:"path"`
	Name    string      `json:"name"`
	Kind    string      `json:"kind"` // file, directory, symlink
	Mode    fs.FileMode `json:"mode"` // permission bits
	Size    int64       `json:"size"`
	Target  string      `json:"target,omitempty"`
	ModTime time.Time   `json:"mtime"`
	// Layer is the index (0 = newest) of the layer that supplies the entry.
	Layer int `json:"-"`

	full string
	dirs []int // directories: the layers merged into it, newest first
}

// Entry kinds in the merged view.
const (
	KindFile      = "file"
	KindDirectory = "directory"
	KindSymlink   = "symlink"
)

// ErrSymlinkInPath means a parent of the path is a symlink in the merged view;
// the store never resolves links, so such a path has no entry of its own.
var ErrSymlinkInPath = errors.New("a parent of the path is a symlink")

// Head is a view of the latest published state; each call reads the head
// manifest current at that moment.
func (s *Store) Head() *View { return &View{s: s} }

// View is a view of the layers a lease pins.
func (s *Store) View(leaseID string) (*View, error) {
	l, err := s.Lease(leaseID)
	if err != nil {
		return nil, err
	}
	return &View{s: s, lease: l}, nil
}

// NewView is a view over explicit layer directories, newest first.
func NewView(dirs ...string) *View { return &View{fixed: plainStack(dirs...)} }

// with runs fn with the view's layer dirs while no GC can delete them.
func (v *View) with(fn func(st stack) error) error {
	if v.s == nil {
		return fn(v.fixed)
	}
	v.s.gcMu.RLock()
	defer v.s.gcMu.RUnlock()
	if v.lease != nil {
		return fn(v.s.stackOf(v.lease.Layers))
	}
	m := v.s.head.Load()
	if m == nil {
		return ErrNoManifest
	}
	return fn(v.s.stackOf(m.Layers))
}

// Stat describes p; a missing path gives an error matching fs.ErrNotExist.
func (v *View) Stat(p string) (Entry, error) {
	var e Entry
	err := v.with(func(st stack) error {
		var err error
		e, err = lookup(st, p)
		return err
	})
	return e, err
}

// NotFileError refuses a file operation on a path that is not a regular
// file (a directory, a symlink, ...): a caller's mistake, not the store's.
// Parent says the conflicting entry is an ancestor of Path.
type NotFileError struct {
	Path   string
	Kind   string
	Parent string
}

func (e *NotFileError) Error() string {
	if e.Parent != "" {
		return fmt.Sprintf("parent %s of %s is a %s", e.Parent, e.Path, e.Kind)
	}
	return fmt.Sprintf("%s is a %s, not a file", e.Path, e.Kind)
}

// ReadFile returns the content of the regular file p, refusing files larger
// than max bytes (max <= 0: no limit).
func (v *View) ReadFile(p string, max int64) ([]byte, Entry, error) {
	var b []byte
	e, err := v.withFile(p, max, func(full string) error {
		var err error
		b, err = os.ReadFile(full)
		return err
	})
	return b, e, err
}

// OpenFile opens the regular file p for reading, with ReadFile's checks, so
// that a caller can stream it. The open file stays readable after a GC
// deletes its layer (layers are never written in place).
func (v *View) OpenFile(p string, max int64) (*os.File, Entry, error) {
	var f *os.File
	e, err := v.withFile(p, max, func(full string) error {
		var err error
		f, err = os.Open(full)
		return err
	})
	return f, e, err
}

// withFile runs fn on the layer file that supplies the regular file p,
// refusing anything else and files larger than max bytes (max <= 0: no
// limit).
func (v *View) withFile(p string, max int64, fn func(full string) error) (Entry, error) {
	var e Entry
	err := v.with(func(st stack) error {
		var err error
		if e, err = lookup(st, p); err != nil {
			return err
		}
		if e.Kind != KindFile {
			return &NotFileError{Path: p, Kind: e.Kind}
		}
		if max > 0 && e.Size > max {
			return &TooLargeError{Path: p, Size: e.Size, Max: max}
		}
		return fn(e.full)
	})
	return e, err
}

// CopyTo is a change that writes the file e at dst, with e's mode and
// content: the content is read from e's layer file when the change is
// published (layer files are never written in place), not held in memory.
func (e Entry) CopyTo(dst string) Change {
	return Change{Path: dst, Kind: ChangeWrite, Mode: e.Mode, Size: e.Size, Source: e.full}
}

// TooLargeError refuses a file above a size limit.
type TooLargeError struct {
	Path      string
	Size, Max int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("file is too large: %s has %d bytes, the limit is %d", e.Path, e.Size, e.Max)
}

// ReadDir lists the merged directory p, sorted by name.
func (v *View) ReadDir(p string) ([]Entry, error) {
	var out []Entry
	err := v.with(func(st stack) error {
		d, err := lookup(st, p)
		if err != nil {
			return err
		}
		if d.Kind != KindDirectory {
			return fmt.Errorf("%s is a %s, not a directory", p, d.Kind)
		}
		out, err = readMergedDir(st, d)
		return err
	})
	return out, err
}

// Walk calls fn for every entry below p (not p itself), depth first in name
// order. Directories are visited before their contents.
func (v *View) Walk(p string, fn func(Entry) error) error {
	return v.with(func(st stack) error {
		d, err := lookup(st, p)
		if err != nil {
			return err
		}
		if d.Kind != KindDirectory {
			return nil
		}
		return walkMerged(st, d, fn)
	})
}

func walkMerged(st stack, d Entry, fn func(Entry) error) error {
	ents, err := readMergedDir(st, d)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := fn(e); err != nil {
			return err
		}
		if e.Kind == KindDirectory {
			if err := walkMerged(st, e, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

func notExist(p string) error { return &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist} }

// lookup resolves p through dirs component by component, keeping for each
// prefix the chain of layers in which it is a directory.
func lookup(st stack, p string) (Entry, error) {
	active := make([]int, st.len())
	for i := range active {
		active[i] = i
	}
	root := Entry{Path: "", Kind: KindDirectory, Mode: 0o755, dirs: active}
	if st.len() > 0 {
		root.full = st.dirs[0]
		if fi, err := os.Lstat(st.dirs[0]); err == nil {
			root.Mode = fi.Mode().Perm()
			root.ModTime = fi.ModTime()
		}
	}
	if p == "" {
		return root, nil
	}
	comps := strings.Split(p, "/")
	for ci := range comps {
		prefix := strings.Join(comps[:ci+1], "/")
		last := ci == len(comps)-1
		var next []int
		var top *layerEntry
		topIdx := -1
		for _, li := range active {
			le, err := st.stat(li, prefix)
			if err != nil {
				return Entry{}, err
			}
			if le.kind == kindAbsent {
				continue
			}
			if top == nil {
				top, topIdx = &le, li
				if le.kind == kindWhiteout || le.kind == kindOther {
					return Entry{}, notExist(p)
				}
				if le.kind != kindDir {
					if last {
						return entryOf(prefix, fullPath(st.dirs[li], prefix), le, li, nil)
					}
					if le.kind == kindSymlink {
						return Entry{}, fmt.Errorf("%s: %w (%s)", p, ErrSymlinkInPath, prefix)
					}
					return Entry{}, notExist(p)
				}
				next = append(next, li)
				if le.opaque {
					break
				}
				continue
			}
			if le.kind != kindDir {
				break // a whiteout or non-directory below cuts the chain
			}
			next = append(next, li)
			if le.opaque {
				break
			}
		}
		if top == nil {
			return Entry{}, notExist(p)
		}
		if last {
			return entryOf(prefix, fullPath(st.dirs[topIdx], prefix), *top, topIdx, next)
		}
		active = next
	}
	return Entry{}, notExist(p)
}

func entryOf(p, full string, le layerEntry, layer int, chain []int) (Entry, error) {
	e := Entry{Path: p, Name: baseName(p), Mode: le.info.Mode().Perm(), ModTime: le.info.ModTime(), Layer: layer, full: full}
	switch le.kind {
	case kindFile:
		e.Kind, e.Size = KindFile, le.info.Size()
	case kindDir:
		e.Kind, e.dirs = KindDirectory, chain
	case kindSymlink:
		e.Kind = KindSymlink
		t, err := os.Readlink(full)
		if err != nil {
			return Entry{}, err
		}
		e.Target, e.Size = t, int64(len(t))
	}
	return e, nil
}

// readMergedDir merges one directory level across the layers of d's chain.
func readMergedDir(st stack, d Entry) ([]Entry, error) {
	type cand struct {
		le    layerEntry
		layer int
		chain []int
		done  bool // a later (lower) layer can no longer contribute
	}
	byName := map[string]*cand{}
	var hidden = map[string]bool{}
	for _, li := range d.dirs {
		names, err := st.list(li, d.Path)
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if hidden[name] {
				continue
			}
			c := byName[name]
			if c != nil && c.done {
				continue
			}
			le, err := st.stat(li, joinPath(d.Path, name))
			if err != nil {
				return nil, err
			}
			if le.kind == kindAbsent {
				continue
			}
			if c == nil {
				if le.kind == kindWhiteout || le.kind == kindOther {
					hidden[name] = true
					continue
				}
				c = &cand{le: le, layer: li}
				byName[name] = c
				if le.kind == kindDir {
					c.chain = []int{li}
					c.done = le.opaque
				} else {
					c.done = true
				}
				continue
			}
			// c is a directory still open to lower layers.
			if le.kind != kindDir {
				c.done = true
				continue
			}
			c.chain = append(c.chain, li)
			c.done = le.opaque
		}
	}
	out := make([]Entry, 0, len(byName))
	for name, c := range byName {
		p := name
		if d.Path != "" {
			p = d.Path + "/" + name
		}
		e, err := entryOf(p, fullPath(st.dirs[c.layer], p), c.le, c.layer, c.chain)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Fingerprints identify a path's state for conflict checks: the content hash
// and full permission bits of a file, the target of a symlink, a directory's
// mode, or absence.
const fpAbsent = "absent"

func fingerprintEntry(e Entry) (string, error) {
	switch e.Kind {
	case KindFile:
		h, err := hashFile(e.full)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("file:%04o:%s", e.Mode, h), nil
	case KindSymlink:
		return "symlink:" + e.Target, nil
	default:
		return fmt.Sprintf("dir:%04o", e.Mode), nil
	}
}

// fingerprint returns the fingerprint of p in dirs.
func fingerprint(st stack, p string) (string, Entry, error) {
	e, err := lookup(st, p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrSymlinkInPath) {
			return fpAbsent, Entry{}, nil
		}
		return "", Entry{}, err
	}
	fp, err := fingerprintEntry(e)
	return fp, e, err
}

// treeFingerprint covers a directory and everything below it.
func treeFingerprint(st stack, d Entry) (string, error) {
	h := sha256.New()
	fp, err := fingerprintEntry(d)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "%s\x00%s\x00", d.Path, fp)
	err = walkMerged(st, d, func(e Entry) error {
		fp, err := fingerprintEntry(e)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%s\x00", e.Path, fp)
		return nil
	})
	if err != nil {
		return "", err
	}
	return "tree:" + hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashBytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
