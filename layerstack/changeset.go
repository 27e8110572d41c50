package layerstack

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"unicode/utf8"
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
// Source is empty, else it is streamed from the file Source.
type Change struct {
	Path   string      `json:"path"`
	Kind   ChangeKind  `json:"kind"`
	Mode   fs.FileMode `json:"mode,omitempty"` // permission bits of a write, dir or opaque dir
	Target string      `json:"target,omitempty"`
	Size   int64       `json:"size,omitempty"`
	Source string      `json:"-"`
	Data   []byte      `json:"-"`
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

// ChangeSet is a session's changes relative to its base.
type ChangeSet struct {
	Changes []Change `json:"changes"`
	Drops   []Drop   `json:"drops,omitempty"`
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
func Capture(upper string) (*ChangeSet, error) {
	cs := &ChangeSet{}
	err := filepath.WalkDir(upper, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("capture %s: %w", full, err)
		}
		if full == upper {
			return nil
		}
		rel, _ := filepath.Rel(upper, full)
		rel = filepath.ToSlash(rel)
		if !utf8.ValidString(rel) {
			cs.Drops = append(cs.Drops, Drop{Path: rel, Reason: DropInvalidPath})
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("capture %s: %w", rel, err)
		}
		le, err := classify(full, fi)
		if err != nil {
			return fmt.Errorf("capture %s: %w", rel, err)
		}
		switch le.kind {
		case kindWhiteout:
			cs.Changes = append(cs.Changes, Change{Path: rel, Kind: ChangeDelete})
		case kindDir:
			if err := checkNoRedirect(full); err != nil {
				return fmt.Errorf("capture: %w", err)
			}
			k := ChangeDir
			if le.opaque {
				k = ChangeOpaque
			}
			cs.Changes = append(cs.Changes, Change{Path: rel, Kind: k, Mode: fi.Mode().Perm()})
		case kindSymlink:
			t, err := os.Readlink(full)
			if err != nil {
				return fmt.Errorf("capture %s: %w", rel, err)
			}
			cs.Changes = append(cs.Changes, Change{Path: rel, Kind: ChangeSymlink, Target: t})
		case kindFile:
			cs.Changes = append(cs.Changes, Change{Path: rel, Kind: ChangeWrite, Mode: fi.Mode().Perm(), Source: full, Size: fi.Size()})
		default:
			cs.Drops = append(cs.Drops, Drop{Path: rel, Reason: DropSpecialFile})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cs, nil
}
