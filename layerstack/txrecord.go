package layerstack

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Committed reports whether transaction txid committed: the daemon asks
// before it aborts, or holds void, a publish whose commit its own record
// does not show (a crash between the store's commit and the daemon's
// record, or a record written with a commit that never reached its commit
// point). The store's record of the txid answers; a committed layer of the
// head that carries the txid answers too, and rewrites a record that was
// lost (written without a flush, or skipped by a commit that failed after
// its commit point) from the layer's metadata, as the boot sweep does.
// Publish with the same TxID then returns the recorded result.
func (s *Store) Committed(txid string) (bool, error) {
	if txid == "" {
		return false, nil
	}
	_, rerr := s.readTx(txid)
	if rerr == nil {
		return true, nil
	}
	m := s.head.Load()
	if m == nil {
		return false, nil
	}
	for _, l := range m.Layers {
		if l.TxID != txid {
			continue
		}
		// Under commitMu: a commit of this txid still between its
		// manifest and its own record (which may add a keep's lease)
		// writes that record first, and is not overwritten.
		s.commitMu.Lock()
		defer s.commitMu.Unlock()
		if _, err := s.readTx(txid); err == nil {
			return true, nil
		}
		meta, err := s.meta(l.ID)
		if err != nil {
			return true, err
		}
		if meta.Result != nil {
			err := s.Injected(FailRebuildRecord)
			if err == nil {
				err = s.writeTx(meta.Result)
			}
			if err != nil {
				return true, err
			}
		}
		return true, nil
	}
	if isNotExist(rerr) {
		return false, nil
	}
	return false, rerr // torn, and not in the head (a squash folded it, or it never committed)
}

// TxRecord returns the store's record of committed transaction txid as a
// replay would answer it, with none of a replay's lease changes; an error
// wrapping fs.ErrNotExist when the store did not commit txid.
func (s *Store) TxRecord(txid string) (*PublishResult, error) {
	ok, err := s.Committed(txid) // rebuilds a lost record from the head
	if ok && err != nil {
		// In the head, but its lost record could not be written again (a
		// full volume): the layer's metadata answers without it.
		if r := s.headResult(txid); r != nil {
			return r, nil
		}
	}
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("transaction %q: %w", txid, fs.ErrNotExist)
	}
	r, err := s.readTx(txid)
	if err != nil {
		return nil, err
	}
	r.Replayed = true
	r.Owner = s.recordOwner(r)
	return r, nil
}

// headResult is the result the head's layer of txid keeps in its metadata,
// as TxRecord answers it (nil: no such layer, or its metadata unreadable).
func (s *Store) headResult(txid string) *PublishResult {
	m := s.head.Load()
	if m == nil {
		return nil
	}
	for _, l := range m.Layers {
		if l.TxID != txid {
			continue
		}
		meta, err := s.meta(l.ID)
		if err != nil || meta.Result == nil || meta.Result.TxID != txid {
			return nil
		}
		r := *meta.Result
		r.Replayed = true
		if r.Owner == "" {
			r.Owner = meta.Owner
		}
		return &r
	}
	return nil
}

// recordOwner is the owner of committed transaction r: its record's, or
// for a record from before records kept it, its layer's while the head
// holds that layer ("" when neither says).
func (s *Store) recordOwner(r *PublishResult) string {
	if r.Owner != "" || r.LayerID == "" {
		return r.Owner
	}
	if m := s.head.Load(); m != nil {
		for _, l := range m.Layers {
			if l.ID == r.LayerID && l.TxID == r.TxID {
				if meta, err := s.meta(l.ID); err == nil {
					return meta.Owner
				}
			}
		}
	}
	return ""
}

// CommitsFrom returns the records of publishes committed from a lease
// (keyed by that lease, from_lease): a session still on such a lease has
// not been closed or moved as its publish asked. It reads every
// transaction record, and the head's layers' metadata for a commit whose
// record was never written (for recovery and boot, not a hot path).
// Records from before they named their lease are not found.
func (s *Store) CommitsFrom() (map[string]*PublishResult, error) {
	out := map[string]*PublishResult{}
	dir := filepath.Join(s.root, dirTxns)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var r PublishResult
		if readJSON(filepath.Join(dir, e.Name()), &r) == nil && r.FromLease != "" {
			r.Replayed = true
			out[r.FromLease] = &r
		}
	}
	if m := s.head.Load(); m != nil {
		for _, l := range m.Layers {
			if l.TxID == "" {
				continue
			}
			if meta, err := s.meta(l.ID); err == nil && meta.Result != nil && meta.Result.FromLease != "" && out[meta.Result.FromLease] == nil {
				r := *meta.Result
				r.Replayed = true
				out[r.FromLease] = &r
			}
		}
	}
	return out, nil
}
