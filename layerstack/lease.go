package layerstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// Lease pins the layers of one manifest for a reader, typically a workspace
// session that mounts them. Leases are persisted, so a restarted daemon
// re-attaches its sessions instead of losing their base.
type Lease struct {
	ID              string          `json:"lease_id"`
	Owner           string          `json:"owner"`
	ManifestVersion int64           `json:"manifest_version"`
	RootHash        string          `json:"root_hash"`
	Layers          []ManifestLayer `json:"layers"`
	Created         time.Time       `json:"created"`
	// Replaces is the lease a session was on when this one was taken for
	// it by a publish with keep (KeptBy, its txid) or a refresh; that one
	// was released with it. A session still recorded on Replaces after a
	// crash had its changes committed into this lease's layers (keep) or
	// merged onto them in a staged upper dir (refresh).
	KeptBy   string `json:"kept_by,omitempty"`
	Replaces string `json:"replaces,omitempty"`
	// transient: held in memory only (Hold), never written.
	transient bool
}

// ErrUnknownLease is returned for a lease id the store does not hold.
var ErrUnknownLease = errors.New("unknown lease")

func (s *Store) leasePath(id string) string { return filepath.Join(s.root, dirLeases, id+".json") }

func (s *Store) loadLeases() error {
	ents, err := os.ReadDir(filepath.Join(s.root, dirLeases))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var l Lease
		if err := readJSON(filepath.Join(s.root, dirLeases, e.Name()), &l); err != nil {
			// A torn lease file cannot exist (atomic writes); an unreadable
			// one must not silently unpin layers.
			return fmt.Errorf("read lease %s: %w", e.Name(), err)
		}
		s.leases[l.ID] = &l
	}
	return nil
}

// Acquire pins the current head for owner.
func (s *Store) Acquire(owner string) (*Lease, error) { return s.AcquireWith(owner, nil) }

// AcquireWith is Acquire with the caller's own file that names the lease
// (record returns it, given the lease; a nil record or file: none) made durable together
// with the lease: both written and flushed side by side
// (atomicfile.WriteFiles), the lease renamed into place first. A process
// that dies in between leaves the lease without the record, as with two
// calls; after a power cut the record may be on disk without the lease,
// and its reader must handle a lease it names that is not held.
func (s *Store) AcquireWith(owner string, record func(*Lease) (*atomicfile.File, error)) (*Lease, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.acquireLocked(owner, record)
}

func (s *Store) acquireLocked(owner string, record func(*Lease) (*atomicfile.File, error)) (*Lease, error) {
	return s.acquire(&Lease{Owner: owner}, record)
}

// lockedHead takes the commit lock and loads the head; with no head it
// lets the lock go and answers ErrNoManifest. The caller unlocks.
func (s *Store) lockedHead() (*Manifest, error) {
	s.commitMu.Lock()
	if m := s.head.Load(); m != nil {
		return m, nil
	}
	s.commitMu.Unlock()
	return nil, ErrNoManifest
}

// Hold pins the current head for owner in memory only: no file is written
// or flushed (no disk wait, and the commit lock only for the moment the
// head is read), and the lease is gone with the process. For a pin that
// need not outlive a crash: what it protects from a collection is the
// layers something mounts while it holds the lease (a warm session's
// start, which a restarted daemon removes). Release lets it go like any.
func (s *Store) Hold(owner string) (*Lease, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	m, err := s.lockedHead()
	if err != nil {
		return nil, err
	}
	defer s.commitMu.Unlock()
	l := &Lease{Owner: owner, transient: true, ID: newID("lease-", m.Version), ManifestVersion: m.Version, RootHash: m.RootHash(),
		Layers: append([]ManifestLayer(nil), m.Layers...), Created: s.opts.Now().UTC()}
	s.mu.Lock()
	s.leases[l.ID] = l
	s.mu.Unlock()
	return l.clone(), nil
}

// acquireKeptLocked is the lease a publish with keep (req) moves its
// session onto.
func (s *Store) acquireKeptLocked(req PublishRequest) (*Lease, error) {
	if err := s.Injected(FailKeepLease); err != nil {
		return nil, err
	}
	return s.acquire(&Lease{Owner: req.Owner, KeptBy: req.TxID, Replaces: req.LeaseID}, nil)
}

// acquire pins the head for l's owner, with l's KeptBy and Replaces.
func (s *Store) acquire(l *Lease, record func(*Lease) (*atomicfile.File, error)) (*Lease, error) {
	m := s.head.Load()
	if m == nil {
		return nil, ErrNoManifest
	}
	l.ID, l.ManifestVersion, l.RootHash = newID("lease-", m.Version), m.Version, m.RootHash()
	l.Layers, l.Created = append([]ManifestLayer(nil), m.Layers...), s.opts.Now().UTC()
	b, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	files := []atomicfile.File{{Name: s.leasePath(l.ID), Data: b, Perm: 0o644}}
	if record != nil {
		f, err := record(l.clone())
		if err != nil {
			return nil, err
		}
		if f != nil {
			files = append(files, *f)
		}
	}
	if err := atomicfile.WriteFiles(files...); err != nil {
		// Renamed into place before a record that failed, the lease goes
		// too (nobody holds it; a restart's open would otherwise load it).
		_ = os.Remove(s.leasePath(l.ID))
		return nil, fmt.Errorf("persist lease: %w", err)
	}
	s.mu.Lock()
	s.leases[l.ID] = l
	s.mu.Unlock()
	return l.clone(), nil
}

// Lease returns a held lease.
func (s *Store) Lease(id string) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownLease, id)
	}
	return l.clone(), nil
}

// Leases lists held leases.
func (s *Store) Leases() []*Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Lease, 0, len(s.leases))
	for _, l := range s.leases {
		out = append(out, l.clone())
	}
	return out
}

// Release drops a lease and deletes the layers nothing references any more.
// Releasing an unknown lease is not an error (release is idempotent).
func (s *Store) Release(id string) error {
	if err := s.check(); err != nil {
		return err
	}
	s.mu.Lock()
	l, ok := s.leases[id]
	delete(s.leases, id)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if !l.transient {
		if err := os.Remove(s.leasePath(id)); err != nil && !isNotExist(err) {
			return fmt.Errorf("release lease %s: %w", id, err)
		}
		_ = atomicfile.SyncDir(filepath.Join(s.root, dirLeases))
	}
	if !s.frees(l) {
		return nil
	}
	_, err := s.collectGarbage()
	return err
}

// frees says whether releasing l (already out of s.leases) leaves a layer
// unreferenced: one of its layers that the head no longer holds (a squash
// replaced it) and no other lease pins. Only then is there garbage to
// collect: GC holds the commit lock and shuts out every reader of layer
// directories while it looks, and sessions are released far more often
// than a squash makes garbage. A squash that commits after the head was
// read here collects what it replaced itself, and of two leases released
// side by side the later look sees both gone (each is removed before its
// release looks, under s.mu).
func (s *Store) frees(l *Lease) bool {
	head := s.head.Load()
	if head == nil {
		return false
	}
	inHead := make(map[string]bool, len(head.Layers))
	for _, ly := range head.Layers {
		inHead[ly.ID] = true
	}
	replaced := map[string]bool{}
	for _, ly := range l.Layers {
		if !inHead[ly.ID] {
			replaced[ly.ID] = true
		}
	}
	if len(replaced) == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.leases {
		for _, ly := range o.Layers {
			delete(replaced, ly.ID)
		}
	}
	return len(replaced) > 0
}

// LowerDirs are the lease's layer directories, newest first: the order an
// overlay mount takes them (the first lowerdir has the highest priority).
func (s *Store) LowerDirs(l *Lease) []string { return s.layerDirs(l.Layers) }

func (l *Lease) clone() *Lease {
	c := *l
	c.Layers = append([]ManifestLayer(nil), l.Layers...)
	return &c
}
