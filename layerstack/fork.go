package layerstack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// ForkResult is what Fork made: the new upper dir's counts and the lease
// on the same layers as the forked session's.
type ForkResult struct {
	Lease   *Lease `json:"lease"`
	Changes int    `json:"changes"`
	Bytes   int64  `json:"bytes"`
}

// Fork starts a second session exactly where one is: it writes cs (the
// change set captured from the upper dir of the session holding leaseID)
// into newUpper, which must not exist, as a private copy — sources are
// read by descriptor and copied, never hardlinked, so neither session
// sees the other's later writes — and leases the same layers as leaseID
// for owner. The layers are shared, not copied; the lease keeps squash
// and GC from dropping them when the first session publishes or ends.
// On error nothing is leased and newUpper is removed.
func (s *Store) Fork(ctx context.Context, leaseID string, cs *ChangeSet, newUpper, owner string) (_ *ForkResult, retErr error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	from, err := s.Lease(leaseID)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(newUpper); err == nil {
		return nil, fmt.Errorf("%w: fork target %s already exists", ErrBadRequest, newUpper)
	}
	defer func() {
		if retErr != nil {
			_ = removeAll(newUpper)
		}
	}()
	b, err := newBuilder(newUpper, s.stackOf(from.Layers))
	if err != nil {
		return nil, err
	}
	res := &ForkResult{}
	for _, ch := range cs.Changes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if ch.Kind == ChangeWrite && ch.Data == nil {
			if err := b.mkdirParents(ch.Path); err != nil {
				return nil, err
			}
			in, _, err := ch.OpenSource()
			if err != nil {
				return nil, fmt.Errorf("fork %s: %w", ch.Path, err)
			}
			full := fullPath(b.dir, ch.Path)
			n, err := cloneOrCopy(in, full)
			in.Close()
			if err == nil {
				err = os.Chmod(full, ch.Mode.Perm())
			}
			if err != nil {
				return nil, fmt.Errorf("fork %s: %w", ch.Path, err)
			}
			b.synced = append(b.synced, full)
			res.Bytes += n
		} else if err := b.add(planned{ch: ch, outcome: OutcomeClean}, false); err != nil {
			return nil, fmt.Errorf("fork %s: %w", ch.Path, err)
		}
		res.Changes++
	}
	if err := b.sync(); err != nil {
		return nil, err
	}
	s.hit(FailForkAfterUpper)
	if res.Lease, err = s.acquireLike(owner, from); err != nil {
		return nil, err
	}
	s.hit(FailForkAfterLease)
	return res, nil
}

// cloneOrCopy writes in's content to dst (created, 0600): a reflink where
// the filesystem has them (the blocks are shared copy-on-write, so later
// writes to either file stay private), else a copy. Never a hardlink.
func cloneOrCopy(in *os.File, dst string) (int64, error) {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		fi, err := out.Stat()
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// acquireLike pins the layers of an existing lease for another owner.
func (s *Store) acquireLike(owner string, from *Lease) (*Lease, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	_, held := s.leases[from.ID]
	s.mu.Unlock()
	if !held {
		return nil, fmt.Errorf("%w: %s (released during the fork)", ErrUnknownLease, from.ID)
	}
	l := &Lease{ID: newID("lease-", from.ManifestVersion), Owner: owner, ManifestVersion: from.ManifestVersion,
		RootHash: from.RootHash, Layers: append([]ManifestLayer(nil), from.Layers...), Created: s.opts.Now().UTC()}
	b, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(s.leasePath(l.ID), b, 0o644); err != nil {
		return nil, fmt.Errorf("persist lease: %w", err)
	}
	_ = atomicfile.SyncDir(filepath.Join(s.root, dirLeases))
	s.mu.Lock()
	s.leases[l.ID] = l
	s.mu.Unlock()
	return l.clone(), nil
}
