package layerstack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// Read-only introspection for the observability views. Nothing here takes
// the store's locks or writes: a layer that GC removes mid-walk is simply
// gone, and its partial numbers are not cached.

// LayerUsage is the disk use of one layer directory.
type LayerUsage struct {
	// Bytes is the logical size: the sum of the layer's regular file sizes.
	Bytes int64 `json:"bytes"`
	// AllocatedBytes is what the layer's files occupy (st_blocks*512),
	// each inode once.
	AllocatedBytes int64 `json:"allocated_bytes"`
	Entries        int   `json:"entries"`
	// shared are the inodes with more than one link (squash hardlinks its
	// sources): counted once across layers by StorageUsage.
	shared map[uint64]int64
}

// usageCache holds the usage of layers by id: layers are immutable, so a
// layer is walked once per process.
type usageCache struct {
	mu sync.Mutex
	m  map[string]LayerUsage

	// The whole store's usage changes only with a commit (manifest
	// version) or a lease: StorageUsage is recomputed only then.
	storageKey    string
	storage       StorageUsage
	invalidations int // layer usages dropped because a squash shares their inodes
}

// LayerUsage returns the disk use of layer l (cached by id).
func (s *Store) LayerUsage(l ManifestLayer) (LayerUsage, error) {
	c := &s.usage
	c.mu.Lock()
	u, ok := c.m[l.ID]
	c.mu.Unlock()
	if ok {
		return u, nil
	}
	u, err := walkUsage(s.layerDir(l))
	if err != nil {
		return u, fmt.Errorf("usage of layer %s: %w", l.ID, err)
	}
	// A squashed layer hardlinks the files of the layers it replaces: their
	// usage, if measured before, counted those inodes as their own. Measure
	// them again so StorageUsage sees the shared inodes on both sides.
	var stale []string
	if meta, err := s.meta(l.ID); err == nil && meta.Kind == LayerSquash {
		stale = meta.Replace
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]LayerUsage{}
	}
	c.m[l.ID] = u
	for _, id := range stale {
		if _, ok := c.m[id]; ok {
			delete(c.m, id)
			c.invalidations++
		}
	}
	c.mu.Unlock()
	return u, nil
}

func walkUsage(dir string) (LayerUsage, error) {
	u := LayerUsage{}
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		if p != dir {
			u.Entries++
		}
		if fi.Mode().IsRegular() {
			u.Bytes += fi.Size()
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		alloc := st.Blocks * 512
		if st.Nlink > 1 && !fi.IsDir() {
			if u.shared == nil {
				u.shared = map[uint64]int64{}
			}
			u.shared[st.Ino] = alloc
			return nil
		}
		u.AllocatedBytes += alloc
		return nil
	})
	for _, a := range u.shared {
		u.AllocatedBytes += a
	}
	return u, err
}

// StorageUsage is the disk use of the whole store.
type StorageUsage struct {
	LogicalBytes   int64 `json:"storage_logical_bytes"`
	AllocatedBytes int64 `json:"storage_allocated_bytes"`
	// Layers counts the layer directories on disk (in the manifest, or
	// only leased).
	Layers int `json:"layer_dirs"`
}

// StorageUsage adds up every layer directory on disk (cached per layer;
// hardlinked inodes once) and the store's own files (metadata, leases,
// transaction records, staging, audit log).
func (s *Store) StorageUsage() (StorageUsage, error) {
	key := s.storageKey()
	c := &s.usage
	c.mu.Lock()
	if c.storageKey == key {
		out := c.storage
		c.mu.Unlock()
		return out, nil
	}
	c.mu.Unlock()
	out, err := s.storageUsage()
	if err == nil {
		c.mu.Lock()
		c.storageKey, c.storage = key, out
		c.mu.Unlock()
	}
	return out, err
}

// storageKey names the store's current state for StorageUsage's cache.
func (s *Store) storageKey() string {
	var b strings.Builder
	if m := s.head.Load(); m != nil {
		fmt.Fprintf(&b, "v%d", m.Version)
	}
	ids := []string{}
	for _, l := range s.Leases() {
		ids = append(ids, l.ID)
	}
	sort.Strings(ids)
	b.WriteString(":" + strings.Join(ids, ","))
	return b.String()
}

func (s *Store) storageUsage() (StorageUsage, error) {
	for {
		s.usage.mu.Lock()
		gen := s.usage.invalidations
		s.usage.mu.Unlock()
		out, err := s.storageUsageOnce()
		s.usage.mu.Lock()
		again := s.usage.invalidations != gen
		s.usage.mu.Unlock()
		if !again {
			return out, err
		}
	}
}

func (s *Store) storageUsageOnce() (StorageUsage, error) {
	var out StorageUsage
	var errs []error
	shared := map[uint64]int64{}
	onDisk := map[string]bool{}
	for _, sub := range []string{dirBase, dirLayers} {
		ents, err := os.ReadDir(filepath.Join(s.root, sub))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
				continue
			}
			u, err := s.LayerUsage(ManifestLayer{ID: e.Name(), Path: filepath.Join(sub, e.Name())})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			onDisk[e.Name()] = true
			out.Layers++
			out.LogicalBytes += u.Bytes
			out.AllocatedBytes += u.AllocatedBytes
			for ino, a := range u.shared {
				if _, seen := shared[ino]; seen {
					out.AllocatedBytes -= a
				}
				shared[ino] = a
			}
		}
	}
	if len(errs) == 0 {
		// Forget layers GC removed: the cache holds what is on disk.
		s.usage.mu.Lock()
		for id := range s.usage.m {
			if !onDisk[id] {
				delete(s.usage.m, id)
			}
		}
		s.usage.mu.Unlock()
	}
	for _, sub := range []string{dirMeta, dirLeases, dirTxns, dirStaging} {
		u, err := walkUsage(filepath.Join(s.root, sub))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		out.LogicalBytes += u.Bytes
		out.AllocatedBytes += u.AllocatedBytes
	}
	for _, f := range []string{"manifest.json", fileAudit} {
		if fi, err := os.Lstat(filepath.Join(s.root, f)); err == nil {
			out.LogicalBytes += fi.Size()
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				out.AllocatedBytes += st.Blocks * 512
			}
		}
	}
	return out, errors.Join(errs...)
}

// StagingEntries counts the entries of the staging directory (work in
// progress of commits and squashes).
func (s *Store) StagingEntries() (int, error) {
	ents, err := os.ReadDir(filepath.Join(s.root, dirStaging))
	if err != nil {
		return 0, fmt.Errorf("read staging: %w", err)
	}
	return len(ents), nil
}

// FindLayer returns the layer id names in the head or in any lease.
func (s *Store) FindLayer(id string) (ManifestLayer, bool) {
	if m := s.head.Load(); m != nil {
		for _, l := range m.Layers {
			if l.ID == id {
				return l, true
			}
		}
	}
	for _, le := range s.Leases() {
		for _, l := range le.Layers {
			if l.ID == id {
				return l, true
			}
		}
	}
	return ManifestLayer{}, false
}

// Entry kinds of LayerEntries (the seed's).
const (
	EntryFile      = "file"
	EntryDirectory = "directory"
	EntrySymlink   = "symlink"
	EntryDelete    = "delete"
	EntryOpaqueDir = "opaque_dir"
	EntryOther     = "other"
)

// LayerEntry is one path a layer holds, in overlay terms.
type LayerEntry struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
}

// LayerEntries lists up to limit entries of layer l in lexical order and
// reports whether there are more.
func (s *Store) LayerEntries(l ManifestLayer, limit int) ([]LayerEntry, bool, error) {
	dir := s.layerDir(l)
	out := []LayerEntry{}
	more := false
	err := walkSorted(dir, "", func(rel, full string, fi fs.FileInfo) (bool, error) {
		if len(out) >= limit {
			more = true
			return false, nil
		}
		e, err := classify(full, fi)
		if err != nil {
			return false, err
		}
		out = append(out, LayerEntry{Path: rel, Kind: entryKind(e)})
		return true, nil
	})
	if err != nil {
		return out, more, fmt.Errorf("entries of layer %s: %w", l.ID, err)
	}
	return out, more, nil
}

func entryKind(e layerEntry) string {
	switch e.kind {
	case kindFile:
		return EntryFile
	case kindDir:
		if e.opaque {
			return EntryOpaqueDir
		}
		return EntryDirectory
	case kindSymlink:
		return EntrySymlink
	case kindWhiteout:
		return EntryDelete
	}
	return EntryOther
}

// walkSorted visits dir's tree depth first in lexical order; fn returns
// false to stop.
func walkSorted(dir, rel string, fn func(rel, full string, fi fs.FileInfo) (bool, error)) error {
	_, err := walkSortedRec(dir, rel, fn)
	return err
}

func walkSortedRec(dir, rel string, fn func(rel, full string, fi fs.FileInfo) (bool, error)) (bool, error) {
	full := filepath.Join(dir, filepath.FromSlash(rel))
	ents, err := os.ReadDir(full)
	if err != nil {
		return false, err
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, de := range ents {
		r := de.Name()
		if rel != "" {
			r = rel + "/" + r
		}
		fi, err := de.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return false, err
		}
		cont, err := fn(r, filepath.Join(full, de.Name()), fi)
		if err != nil || !cont {
			return false, err
		}
		if fi.IsDir() {
			if cont, err := walkSortedRec(dir, r, fn); err != nil || !cont {
				return false, err
			}
		}
	}
	return true, nil
}
