package layerstack

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// RefreshResult describes a session brought up to date with the head.
type RefreshResult struct {
	LeaseID     string   `json:"lease_id"`
	Revision    Revision `json:"revision"`
	MergedPaths []string `json:"merged_paths,omitempty"`
	Changes     int      `json:"changed_paths"`
	// UpToDate is true when the lease was already on the head: nothing was
	// written and the caller keeps its upper dir and lease.
	UpToDate bool `json:"up_to_date"`
}

// Refresh merges the layers published since a session's base under its
// change set, without committing anything: it writes the resolved change
// set, relative to the current head, into newUpper (which must not exist),
// moves the session onto a new lease at that head and releases the old one.
// On conflict it returns the same *ConflictError a publish would, and
// nothing changes.
func (s *Store) Refresh(ctx context.Context, leaseID string, cs *ChangeSet, newUpper string) (*RefreshResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	lease, err := s.Lease(leaseID)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(newUpper); err == nil {
		return nil, fmt.Errorf("%w: refresh target %s already exists", ErrBadRequest, newUpper)
	}
	if head := s.head.Load(); head.Version == lease.ManifestVersion {
		return &RefreshResult{LeaseID: leaseID, Revision: head.Revision(), UpToDate: true}, nil
	}
	// The change set is frozen (copied) before the commit lock, as a
	// publish's is: a session refreshing gigabytes does not hold up every
	// publish of the sandbox while it copies.
	tx, err := s.newTxn(ctx, PublishRequest{TxID: "refresh-" + lease.ID, Changes: cs, Owner: lease.Owner, SourcesRead: s.refreshFrozen})
	if err != nil {
		return nil, err
	}
	defer tx.cleanup()
	s.commitMu.Lock()
	head := s.head.Load()
	if head.Version == lease.ManifestVersion {
		s.commitMu.Unlock()
		return &RefreshResult{LeaseID: leaseID, Revision: head.Revision(), UpToDate: true}, nil
	}
	res, err := s.refreshLocked(ctx, tx, lease, head, newUpper, lease.ID)
	s.commitMu.Unlock()
	if err != nil {
		_ = removeAll(newUpper)
		return nil, err
	}
	if err := s.Release(leaseID); err != nil {
		s.log.Warn("release lease after refresh", "lease", leaseID, "err", err)
	}
	return res, nil
}

// StageOnHead writes the would-be head of publishing cs (captured over
// lease leaseID): cs resolved against the current head, as an upper dir
// newUpper (which must not exist) over a new lease at that head, acquired
// for owner. Unlike Refresh the source lease is kept and the upper dir is
// written even when the lease is on the head. On conflict it returns the
// *ConflictError a publish would, and nothing is written.
func (s *Store) StageOnHead(ctx context.Context, leaseID string, cs *ChangeSet, newUpper, owner string) (*RefreshResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	lease, err := s.Lease(leaseID)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(newUpper); err == nil {
		return nil, fmt.Errorf("%w: stage target %s already exists", ErrBadRequest, newUpper)
	}
	l := *lease
	l.Owner = owner
	tx, err := s.newTxn(ctx, PublishRequest{TxID: "refresh-" + l.ID, Changes: cs, Owner: l.Owner})
	if err != nil {
		return nil, err
	}
	defer tx.cleanup()
	s.commitMu.Lock()
	res, err := s.refreshLocked(ctx, tx, &l, s.head.Load(), newUpper, "")
	s.commitMu.Unlock()
	if err != nil {
		_ = removeAll(newUpper)
		return nil, err
	}
	return res, nil
}

// refreshLocked stages tx (a change set over lease, frozen) onto head in
// newUpper and takes the lease for it, which replaces the lease named
// replaces ("": none). commitMu is held.
func (s *Store) refreshLocked(ctx context.Context, tx *txn, lease *Lease, head *Manifest, newUpper, replaces string) (*RefreshResult, error) {
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	plan, _, err := tx.plan(lease.Layers, head)
	if err != nil {
		return nil, err
	}
	b, err := newBuilder(newUpper, s.stackOf(head.Layers))
	if err != nil {
		return nil, err
	}
	res := &RefreshResult{Revision: head.Revision(), Changes: len(plan)}
	for _, pl := range plan {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := b.add(pl, true); err != nil {
			return nil, fmt.Errorf("refresh %s: %w", pl.ch.Path, err)
		}
		if pl.outcome == OutcomeMerged {
			res.MergedPaths = append(res.MergedPaths, pl.ch.Path)
		}
	}
	if err := b.sync(); err != nil {
		return nil, err
	}
	l, err := s.acquire(&Lease{Owner: lease.Owner, Replaces: replaces}, nil)
	if err != nil {
		return nil, err
	}
	res.LeaseID = l.ID
	return res, nil
}

// IsConflict reports whether err is a publish or refresh rejection.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }
