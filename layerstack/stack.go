package layerstack

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// stack is an ordered list of layer directories, newest first, with an
// in-memory index for each layer that is known to be immutable. Lookups
// through an indexed layer cost a map access instead of lstat and getxattr
// calls, which keeps a deep stack cheap to read.
type stack struct {
	dirs []string
	idx  []*layerIndex // parallel to dirs; nil means "read the directory live"
}

func plainStack(dirs ...string) stack { return stack{dirs: dirs, idx: make([]*layerIndex, len(dirs))} }

func (st stack) len() int { return len(st.dirs) }

func (st stack) slice(from, to int) stack {
	return stack{dirs: st.dirs[from:to], idx: st.idx[from:to]}
}

// stat classifies p inside layer i.
func (st stack) stat(i int, p string) (layerEntry, error) {
	if ix := st.idx[i]; ix != nil {
		return ix.entries[p], nil // the zero value is kindAbsent
	}
	return statLayer(fullPath(st.dirs[i], p))
}

// list returns the names directly inside directory p of layer i.
func (st stack) list(i int, p string) ([]string, error) {
	if ix := st.idx[i]; ix != nil {
		return ix.children[p], nil
	}
	ents, err := os.ReadDir(fullPath(st.dirs[i], p))
	if err != nil {
		if isNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	names := make([]string, len(ents))
	for k, e := range ents {
		names[k] = e.Name()
	}
	return names, nil
}

// layerIndex lists one immutable layer in memory.
type layerIndex struct {
	entries  map[string]layerEntry
	children map[string][]string
}

// maxIndexEntries bounds the memory an index may take; a larger layer is
// read live (about 200 bytes per entry).
const maxIndexEntries = 250_000

var errIndexTooLarge = fs.ErrInvalid

func buildIndex(dir string) (*layerIndex, error) {
	ix := &layerIndex{entries: map[string]layerEntry{}, children: map[string][]string{}}
	err := filepath.WalkDir(dir, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if len(ix.entries) >= maxIndexEntries {
			return errIndexTooLarge
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		le, err := classify(full, fi)
		if err != nil {
			return err
		}
		rel := ""
		if full != dir {
			rel = filepath.ToSlash(full[len(dir)+1:])
			par := parentOf(rel)
			ix.children[par] = append(ix.children[par], baseName(rel))
		}
		ix.entries[rel] = le
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, c := range ix.children {
		sort.Strings(c)
	}
	return ix, nil
}

// stackOf returns the stack of manifest layers, indexing each layer once.
func (s *Store) stackOf(ls []ManifestLayer) stack {
	st := stack{dirs: s.layerDirs(ls), idx: make([]*layerIndex, len(ls))}
	for i, l := range ls {
		st.idx[i] = s.index(l.ID, st.dirs[i])
	}
	return st
}

func (s *Store) index(id, dir string) *layerIndex {
	s.idxMu.Lock()
	ix, ok := s.indexes[id]
	s.idxMu.Unlock()
	if ok {
		return ix
	}
	ix, err := buildIndex(dir)
	if err != nil {
		ix = nil // too large or unreadable: read it live
	}
	s.idxMu.Lock()
	s.indexes[id] = ix
	s.idxMu.Unlock()
	return ix
}

func (s *Store) dropIndex(id string) {
	s.idxMu.Lock()
	delete(s.indexes, id)
	s.idxMu.Unlock()
}
