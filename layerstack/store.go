package layerstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/internal/spreaddir"
)

// Options tune a Store. The zero value is the product default.
type Options struct {
	// AutoSquashAt squashes automatically once the head has more layers than
	// this (default 100; negative disables; values 1 and 2 are raised to 3).
	AutoSquashAt int
	// MaxDepth is the most layers a publish may find under it before it
	// squashes first, autosquash or not (default and ceiling DefaultMaxDepth:
	// a session mounts its lease's layers as overlay lower dirs, and the
	// kernel takes at most 500).
	MaxDepth int
	// Logger receives store events; nil discards them.
	Logger *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// SkipEnvironmentCheck skips the d_type and overlay probe of Open. Only for
	// tools that read a copied store on a machine that will never mount it.
	SkipEnvironmentCheck bool
}

// Store is one layer stack on one directory. Only one process may own a
// store at a time (an flock on .lock); inside the process, commits are
// serialised by commitMu and layer deletion (GC) excludes readers via gcMu.
type Store struct {
	root   string
	opts   Options
	log    *slog.Logger
	lockF  *os.File
	fail   failpoints
	closed atomic.Bool

	commitMu sync.Mutex   // one commit (publish, amend, squash commit) at a time
	gcMu     sync.RWMutex // readers of layer dirs share; GC excludes them
	head     atomic.Pointer[Manifest]

	mu     sync.Mutex // guards leases and metas
	leases map[string]*Lease
	metas  map[string]*LayerMeta

	squashing atomic.Bool
	squashMu  sync.Mutex // one squash at a time

	idxMu   sync.Mutex
	indexes map[string]*layerIndex // by layer id; layers are immutable

	usage usageCache // disk use per layer id, for the observability views

	// tidy counts the staging dirs of committed publishes still being
	// removed after their answer (added under commitMu; Verify and Close
	// wait for them under it).
	tidy sync.WaitGroup

	// rebased counts publishes committed on a head that moved while their
	// layer was built, without building it again (untouchedSince).
	rebased atomic.Int64
	// afterBuild, set by tests only, runs when a publish has built its
	// layer outside the commit lock, before it takes the lock.
	afterBuild func()
	// refreshFrozen, set by tests only, runs when a refresh has frozen its
	// change set, before it takes the commit lock.
	refreshFrozen func()
}

// Store directory layout.
const (
	dirLayers  = "layers"
	dirBase    = "base"
	dirMeta    = "meta"
	dirStaging = "staging"
	dirLeases  = "leases"
	dirTxns    = "txns"
	fileAudit  = "audit.ndjson"
	fileLock   = ".lock"
)

// ErrStoreLocked means another process owns the store.
var ErrStoreLocked = errors.New("layer stack is owned by another process")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("layer stack is closed")

// Open opens (creating if needed) the store at root, takes its writer lock,
// and runs the boot sweep. A store without a manifest is valid; Init gives it
// a base.
func Open(root string, opts Options) (*Store, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"", dirLayers, dirBase, dirMeta, dirStaging, dirLeases, dirTxns} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, fmt.Errorf("open layer stack %s: %w", root, err)
		}
	}
	// The directories where layers, squashes and imports are built are
	// made and removed all day: their subdirectories are spread over the
	// file system's groups (spreaddir's doc says why that matters on ext4).
	for _, d := range []string{dirBase, dirStaging} {
		_, _ = spreaddir.Spread(filepath.Join(root, d))
	}
	if !opts.SkipEnvironmentCheck {
		if err := CheckEnvironment(root); err != nil {
			return nil, err
		}
	}
	lf, err := os.OpenFile(filepath.Join(root, fileLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open layer stack lock: %w", err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", root, ErrStoreLocked)
		}
		return nil, fmt.Errorf("lock layer stack: %w", err)
	}
	if opts.AutoSquashAt == 0 {
		opts.AutoSquashAt = 100
	} else if opts.AutoSquashAt > 0 && opts.AutoSquashAt < 3 {
		opts.AutoSquashAt = 3
	}
	if opts.MaxDepth <= 0 || opts.MaxDepth > DefaultMaxDepth {
		opts.MaxDepth = DefaultMaxDepth
	} else if opts.MaxDepth < 3 {
		opts.MaxDepth = 3
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		root: root, opts: opts, log: log, lockF: lf,
		fail:    failpointsFromEnv(),
		leases:  map[string]*Lease{},
		metas:   map[string]*LayerMeta{},
		indexes: map[string]*layerIndex{},
	}
	if err := s.loadLeases(); err != nil {
		lf.Close()
		return nil, err
	}
	m, err := readManifest(root)
	switch {
	case err == nil:
		s.head.Store(m)
		if err := s.recover(); err != nil {
			lf.Close()
			return nil, err
		}
	case errors.Is(err, ErrNoManifest):
		// Fail closed: without a manifest nothing is provably unreferenced.
	default:
		lf.Close()
		return nil, fmt.Errorf("open layer stack %s: %w (nothing was deleted)", root, err)
	}
	return s, nil
}

// Close releases the writer lock. Leases stay persisted.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.tidy.Wait()
	return s.lockF.Close()
}

// Root is the store directory.
func (s *Store) Root() string { return s.root }

// Manifest returns a copy of the current head manifest.
func (s *Store) Manifest() (*Manifest, error) {
	m := s.head.Load()
	if m == nil {
		return nil, ErrNoManifest
	}
	return m.clone(), nil
}

// Init publishes base as version 1 of an empty store. base is a directory
// made by ImportDir or ImportTar under Root()/base (or a shared base mounted
// there). Init on a store that already has this base is a no-op.
func (s *Store) Init(ctx context.Context, base BaseInfo) (*Manifest, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if m := s.head.Load(); m != nil {
		if m.Base().ID == base.ID {
			return m.clone(), nil
		}
		return nil, fmt.Errorf("layer stack already has base %s", m.Base().ID)
	}
	rel := filepath.Join(dirBase, base.ID)
	if fi, err := os.Stat(filepath.Join(s.root, rel)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("base %s is not under %s: %v", base.ID, filepath.Join(s.root, dirBase), err)
	}
	meta := &LayerMeta{ID: base.ID, Kind: LayerBase, Time: s.opts.Now().UTC(), Digest: base.RootHash,
		Counts: base.Counts, Bytes: base.Bytes, Owner: "original"}
	if err := s.writeMeta(meta); err != nil {
		return nil, err
	}
	m := &Manifest{SchemaVersion: ManifestSchemaVersion, Version: 1, Layers: []ManifestLayer{{ID: base.ID, Path: rel}}}
	if err := writeManifest(s.root, m); err != nil {
		return nil, fmt.Errorf("init manifest: %w", err)
	}
	s.head.Store(m)
	return m.clone(), nil
}

// recover is the boot sweep: with a readable manifest it removes layers no
// manifest or lease references, clears staging, and rebuilds transaction
// records for commits whose record was lost in a crash.
func (s *Store) recover() error {
	m := s.head.Load()
	if err := s.clearStaging(); err != nil {
		return err
	}
	for _, l := range m.Layers {
		if l.TxID == "" {
			continue
		}
		if _, err := s.readTx(l.TxID); err == nil {
			continue
		}
		meta, err := s.meta(l.ID)
		if err != nil {
			return fmt.Errorf("recover transaction %s: %w", l.TxID, err)
		}
		if meta.Result != nil {
			if err := s.writeTx(meta.Result); err != nil {
				return err
			}
			s.appendAudit(meta)
		}
	}
	_, err := s.collectGarbage()
	return err
}

func (s *Store) clearStaging() error {
	ents, err := os.ReadDir(filepath.Join(s.root, dirStaging))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := removeAll(filepath.Join(s.root, dirStaging, e.Name())); err != nil {
			return fmt.Errorf("clear staging: %w", err)
		}
	}
	return nil
}

// collectGarbage deletes layers (and their metadata) that neither the head
// manifest nor a lease references. Base layers are never deleted here. It
// takes the commit lock, because a commit renames its layer into layers/
// before the manifest names it; the caller must hold neither lock.
func (s *Store) collectGarbage() ([]string, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	m := s.head.Load()
	if m == nil {
		return nil, nil
	}
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	live := map[string]bool{}
	for _, l := range m.Layers {
		live[l.ID] = true
	}
	s.mu.Lock()
	for _, l := range s.leases {
		for _, ly := range l.Layers {
			live[ly.ID] = true
		}
	}
	s.mu.Unlock()
	ents, err := os.ReadDir(filepath.Join(s.root, dirLayers))
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		if live[e.Name()] {
			continue
		}
		if err := removeAll(filepath.Join(s.root, dirLayers, e.Name())); err != nil {
			return removed, fmt.Errorf("collect layer %s: %w", e.Name(), err)
		}
		os.Remove(filepath.Join(s.root, dirMeta, e.Name()+".json"))
		s.mu.Lock()
		delete(s.metas, e.Name())
		s.mu.Unlock()
		s.dropIndex(e.Name())
		removed = append(removed, e.Name())
	}
	return removed, nil
}

func newID(prefix string, version int64) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%06d-%s", prefix, version, hex.EncodeToString(b[:]))
}

func (s *Store) layerDir(l ManifestLayer) string { return filepath.Join(s.root, l.Path) }

// layerDirs returns absolute layer directories, newest first.
func (s *Store) layerDirs(ls []ManifestLayer) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = s.layerDir(l)
	}
	return out
}

// CheckEnvironment says what is missing for a layer stack at root: directory
// entries must report their type (d_type), the kernel must offer overlayfs,
// and root must not itself be on overlayfs (an overlay cannot use another
// overlay's directories as upper or work dirs).
func CheckEnvironment(root string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", root, err)
	}
	if st.Type == unix.OVERLAYFS_SUPER_MAGIC {
		return fmt.Errorf("layer stack root %s is on overlayfs: put it on a volume (ext4, xfs) so layers can be mounted as overlay lower, upper and work dirs", root)
	}
	fsb, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("cannot read /proc/filesystems to check for overlayfs: %w", err)
	}
	if !strings.Contains(string(fsb), "\toverlay\n") {
		return fmt.Errorf("the kernel does not offer overlayfs (no 'overlay' in /proc/filesystems): load the overlay module (modprobe overlay)")
	}
	return checkDType(root)
}

func checkDType(root string) error {
	dir, err := os.MkdirTemp(root, ".dtype-probe-")
	if err != nil {
		return fmt.Errorf("d_type probe in %s: %w", root, err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		return fmt.Errorf("d_type probe: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("d_type probe: %w", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	n, err := unix.Getdents(fd, buf)
	if err != nil {
		return fmt.Errorf("d_type probe: %w", err)
	}
	for off := 0; off < n; {
		// struct linux_dirent64: ino u64, off i64, reclen u16, type u8, name
		reclen := int(buf[off+16]) | int(buf[off+17])<<8
		typ := buf[off+18]
		name := string(buf[off+19 : off+reclen])
		if i := strings.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if name == "f" && typ == unix.DT_UNKNOWN {
			return fmt.Errorf("the filesystem under %s does not report file types in directory entries (d_type): overlayfs needs it (for xfs: mkfs.xfs -n ftype=1)", root)
		}
		off += reclen
	}
	return nil
}

func (s *Store) check() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// readJSON reads a JSON file into v.
func readJSON(name string, v any) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
