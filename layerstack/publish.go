package layerstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// PublishRequest commits a session's change set made on the layers of a
// lease. TxID makes the commit idempotent: a retry with the same TxID returns
// the first result and writes nothing.
type PublishRequest struct {
	TxID    string
	LeaseID string
	Changes *ChangeSet
	Owner   string // workspace_session:<id> or operation:<request_id>
	Agent   string
	Message string
	// Keep moves the lease onto the new head after the commit, so the
	// session continues on top of what it just published (publish --keep).
	Keep bool
	// AllowDrops tolerates unsupported special files in the change set
	// (implicit sessions); otherwise any drop rejects the publish.
	AllowDrops bool
	// SourcesRead, when set, runs once every write's source has been
	// copied into staging (or copying failed): from then on the publish no
	// longer reads the captured directory, so a caller that froze the
	// session for the capture can thaw it there rather than across the
	// commit.
	SourcesRead func()
	// ExpectVersion, when set, commits only onto the head of that manifest
	// version (compare and commit: a verified publish commits exactly the
	// tree it verified); another head fails with *HeadMovedError and
	// nothing is written.
	ExpectVersion int64
	// Record, when set, is the caller's own record of the publish, made
	// durable by the commit's flush (see CommitRecord).
	Record *CommitRecord
}

// CommitRecord is a caller's record written with a commit: a new file at
// Path holding Data, created (its directory too) just before the commit's
// flush and flushed with the layer, so it is on disk whenever the commit
// is, without a flush of its own after the commit. Path must be on the
// store's file system (a large commit flushes with one syncfs of it). It
// is removed when the commit fails before its commit point; a crash there
// leaves it behind, so its reader must hold it void unless
// Committed(txid) says otherwise.
// Written reports whether the commit wrote it: a record that could not be
// written (a full volume) does not fail the commit, and the caller records
// the publish its own way.
type CommitRecord struct {
	Path    string
	Data    []byte
	Written bool
}

// write creates the record (and its directory) and puts it and the
// directory entries that name it into the commit's flush.
func (r *CommitRecord) write(sb *syncBatch) error {
	dir := filepath.Dir(r.Path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := createUnsynced(r.Path, r.Data, 0o600)
	if err != nil {
		return err
	}
	r.Written = true // from here a failure removes it (commit)
	sb.addFile(f)
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := sb.add(d); err != nil {
			return err
		}
	}
	return nil
}

// HeadMovedError: the head is no longer the version a publish expected.
type HeadMovedError struct {
	Expected int64
	Head     Revision
}

func (e *HeadMovedError) Error() string {
	return fmt.Sprintf("the head moved: expected manifest version %d, found %d", e.Expected, e.Head.ManifestVersion)
}

// RouteSummary counts changed paths by route.
type RouteSummary struct {
	SourceCount  int `json:"source_count"`
	IgnoredCount int `json:"ignored_count"`
}

// PublishResult describes a commit (or, for a dry run, what it would do).
type PublishResult struct {
	TxID         string       `json:"txid"`
	NoOp         bool         `json:"no_op"`
	LayerID      string       `json:"layer_id,omitempty"`
	Revision     Revision     `json:"revision"`
	RouteSummary RouteSummary `json:"route_summary"`
	Counts       Counts       `json:"counts"`
	Bytes        int64        `json:"bytes"`
	MergedPaths  []string     `json:"merged_paths,omitempty"`
	Paths        int          `json:"changed_paths"`
	// LeaseID is the session's new lease after a publish with Keep.
	LeaseID string `json:"lease_id,omitempty"`
	// Owner, Keep and FromLease (the lease the publish was made on) are
	// the committed request's; records from before they were kept have
	// none (TxRecord finds the owner in the layer's metadata). A retry of
	// the txid is checked against them.
	Owner     string `json:"owner,omitempty"`
	Keep      bool   `json:"keep,omitempty"`
	FromLease string `json:"from_lease,omitempty"`
	Replayed  bool   `json:"replayed,omitempty"`
	DryRun    bool   `json:"dry_run,omitempty"`
}

// result starts the record of req committed (or found a no-op) on head.
func (req PublishRequest) result(head *Manifest) *PublishResult {
	return &PublishResult{TxID: req.TxID, Revision: head.Revision(), Owner: req.Owner, Keep: req.Keep, FromLease: req.LeaseID}
}

// ErrBadRequest marks caller mistakes (missing txid, unknown lease...).
var ErrBadRequest = errors.New("bad publish request")

// ErrTxTaken refuses a publish whose txid another owner committed (the
// store's record of the txid names its owner): nothing is replayed or
// changed.
var ErrTxTaken = fmt.Errorf("%w: the txid names another owner's publish", ErrBadRequest)

// DefaultMaxDepth is Options.MaxDepth's default and ceiling: overlayfs
// mounts at most 500 lower dirs, and a session's mount is its lease's
// layers; the rest is headroom for publishes racing past the check.
const DefaultMaxDepth = 400

// ErrTooDeep refuses a publish onto a head MaxDepth layers deep that a
// squash could not make shallower (sessions' leases pin its layers).
var ErrTooDeep = errors.New("layer stack too deep")

// keepShallow squashes, before a publish, a head that is MaxDepth layers
// deep (with autosquash off, or when publishes outran it): one more layer
// and the sessions could no longer mount the head.
func (s *Store) keepShallow(ctx context.Context) error {
	if m := s.head.Load(); m == nil || len(m.Layers) < s.opts.MaxDepth {
		return nil
	}
	if _, err := s.Squash(ctx); err != nil {
		return fmt.Errorf("squash a head of %d layers before publishing: %w", len(s.head.Load().Layers), err)
	}
	if n := len(s.head.Load().Layers); n >= s.opts.MaxDepth {
		return fmt.Errorf("%w: the head has %d layers (at most %d) and the sessions' leases keep a squash from folding them; refresh or destroy old sessions, then publish again", ErrTooDeep, n, s.opts.MaxDepth)
	}
	return nil
}

// maxOptimistic is how many times a publish resolves outside the commit lock
// before it resolves under it (so a busy stack cannot starve it).
const maxOptimistic = 3

// Publish checks the change set against the head and commits it as one new
// layer, or commits nothing and returns a *ConflictError.
func (s *Store) Publish(ctx context.Context, req PublishRequest) (*PublishResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if req.TxID == "" {
		return nil, fmt.Errorf("%w: txid is required", ErrBadRequest)
	}
	if r, err := s.replay(req); r != nil || err != nil {
		return r, err
	}
	lease, err := s.Lease(req.LeaseID)
	if err != nil {
		return nil, err
	}
	if err := s.keepShallow(ctx); err != nil {
		return nil, err
	}
	tx, err := s.newTxn(ctx, req)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !tx.committed { // else being removed already (publishOnce)
			tx.cleanup()
		}
	}()
	for attempt := 0; ; attempt++ {
		locked := attempt >= maxOptimistic
		if locked {
			s.commitMu.Lock()
		}
		res, err := s.publishOnce(ctx, tx, lease, locked)
		if locked {
			s.commitMu.Unlock()
		}
		if err != nil {
			// Another attempt of this same transaction (a retry that
			// overlapped a slow first one) may have committed meanwhile:
			// its result is this one's, not a conflict with itself. One
			// of another owner's under this txid ends it: every attempt
			// would find that commit's record.
			r, rerr := s.replay(req)
			if r != nil && rerr == nil {
				return r, nil
			}
			if errors.Is(rerr, ErrTxTaken) {
				return nil, rerr
			}
		}
		if errors.Is(err, errStale) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if req.Keep {
			s.releaseAfterKeep(req.LeaseID)
		}
		s.maybeAutoSquash()
		return res, nil
	}
}

// CheckPublish is a dry run of Publish: the same resolution against the
// current head, nothing written. It returns what the publish would do, or
// the *ConflictError it would fail with.
func (s *Store) CheckPublish(ctx context.Context, req PublishRequest) (*PublishResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	lease, err := s.Lease(req.LeaseID)
	if err != nil {
		return nil, err
	}
	req.TxID = "dry-run"
	tx, err := s.newTxn(ctx, req)
	if err != nil {
		return nil, err
	}
	defer tx.cleanup()
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	head := s.head.Load()
	plan, sum, err := tx.plan(lease.Layers, head)
	if err != nil {
		return nil, err
	}
	res := tx.result(plan, head, "")
	res.DryRun, res.TxID, res.RouteSummary = true, "", sum
	for _, pl := range plan {
		switch pl.ch.Kind {
		case ChangeWrite:
			res.Counts.Files++
			res.Bytes += pl.ch.Size
		case ChangeDelete:
			res.Counts.Deletes++
		case ChangeSymlink:
			res.Counts.Symlinks++
		case ChangeDir:
			res.Counts.Dirs++
		case ChangeOpaque:
			res.Counts.Opaques++
		}
	}
	return res, nil
}

// replay returns the recorded result of a committed transaction.
func (s *Store) replay(req PublishRequest) (*PublishResult, error) {
	r, err := s.readTx(req.TxID)
	if isNotExist(err) {
		// A commit that failed after its commit point (re-leasing, the
		// directory's flush) wrote no record: Committed finds its layer
		// in the head and rebuilds the record, so the txid is replayed,
		// never committed a second time.
		if ok, cerr := s.Committed(req.TxID); cerr != nil {
			return nil, cerr
		} else if !ok {
			return nil, nil
		}
		r, err = s.readTx(req.TxID)
	}
	if err != nil {
		return nil, err
	}
	r.Owner = s.recordOwner(r)
	if req.Owner != "" && r.Owner != "" && req.Owner != r.Owner {
		// Never another's commit for this one: the caller would take it
		// for its own and close or move its session on it.
		return nil, fmt.Errorf("%w: txid %q was committed by %s, not %s", ErrTxTaken, req.TxID, r.Owner, req.Owner)
	}
	r.Replayed = true
	if req.Keep {
		// The first attempt may have died between commit and re-lease.
		if _, err := s.Lease(r.LeaseID); r.LeaseID == "" || err != nil {
			s.commitMu.Lock()
			l, err := s.acquireKeptLocked(req)
			s.commitMu.Unlock()
			if err != nil {
				return nil, err
			}
			r.LeaseID = l.ID
			_ = s.writeTx(r)
		}
		if req.LeaseID != r.LeaseID {
			s.releaseAfterKeep(req.LeaseID)
		}
	}
	return r, nil
}

func (s *Store) releaseAfterKeep(old string) {
	if err := s.Release(old); err != nil {
		s.log.Warn("release lease after keep", "lease", old, "err", err)
	}
}

// txn is one publish in progress: its staging dir and frozen content.
type txn struct {
	s       *Store
	req     PublishRequest
	dir     string
	changes []Change
	ours    map[string]string // path -> sha256 of the frozen content
	layerN  int
	// committed: a commit of this transaction succeeded (and counted its
	// staging's removal in s.tidy).
	committed bool
	// rewriteBelowHead: an identical write is a change unless the head's
	// version is in its newest layer (commitOnHead).
	rewriteBelowHead bool
}

// newTxn validates the change set and freezes the content of every write by
// copying it into staging (hashing as it copies): what is checked is what is
// committed, whatever the session does to its upper dir meanwhile.
func (s *Store) newTxn(ctx context.Context, req PublishRequest) (*txn, error) {
	if req.Changes == nil {
		req.Changes = &ChangeSet{}
	}
	var conflicts []Conflict
	for _, d := range req.Changes.Drops {
		if req.AllowDrops && d.Reason == DropSpecialFile {
			continue
		}
		conflicts = append(conflicts, Conflict{Path: d.Path, Reason: d.Reason, Kind: ConflictDropped,
			Message: "this entry cannot be published (" + d.Reason + ")"})
	}
	changes := req.Changes.normalize()
	for i, c := range changes {
		p, err := CleanPath(c.Path)
		if err == nil {
			err = CheckPublishable(p)
		}
		if err != nil {
			var pe *PathError
			errors.As(err, &pe)
			kind := ConflictInvalid
			if pe.Reason == ReasonProtectedPath {
				kind = ConflictProtected
			}
			conflicts = append(conflicts, Conflict{Path: c.Path, Reason: pe.Reason, Kind: kind, Message: pe.Detail})
			continue
		}
		changes[i].Path = p
		if c.Kind == ChangeWrite || c.Kind == ChangeDir || c.Kind == ChangeOpaque {
			changes[i].Mode = c.Mode.Perm()
			if changes[i].Mode == 0 && c.Kind != ChangeWrite {
				changes[i].Mode = 0o755
			}
		}
	}
	if len(conflicts) > 0 {
		var head Revision
		if m := s.head.Load(); m != nil {
			head = m.Revision()
		}
		return nil, &ConflictError{Conflicts: conflicts, Head: head}
	}
	dir, err := os.MkdirTemp(filepath.Join(s.root, dirStaging), "tx-"+txKey(req.TxID)[:12]+"-")
	if err != nil {
		return nil, fmt.Errorf("staging: %w", err)
	}
	t := &txn{s: s, req: req, dir: dir, changes: changes, ours: map[string]string{}}
	err = t.freeze(ctx)
	if req.SourcesRead != nil {
		req.SourcesRead()
	}
	if err != nil {
		t.cleanup()
		return nil, err
	}
	return t, nil
}

func (t *txn) freeze(ctx context.Context) error {
	if err := os.Mkdir(filepath.Join(t.dir, "ours"), 0o700); err != nil {
		return err
	}
	for i := range t.changes {
		c := &t.changes[i]
		if c.Kind != ChangeWrite {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		dst := filepath.Join(t.dir, "ours", strconv.Itoa(i))
		if c.Data != nil || c.Source == "" {
			// In-memory content is already frozen (the caller handed it over).
			if c.Data == nil {
				c.Data = []byte{}
			}
			t.ours[c.Path] = hashBytes(c.Data)
			c.Size = int64(len(c.Data))
			continue
		}
		in, fi, err := c.OpenSource()
		if err != nil {
			return fmt.Errorf("capture %s: %w", c.Path, unwrapPathErr(err))
		}
		h, n, err := copyOpen(in, dst)
		in.Close()
		if err != nil {
			return fmt.Errorf("capture %s: %w", c.Path, unwrapPathErr(err))
		}
		setMtime(dst, fi.ModTime())
		t.ours[c.Path], c.Size = h, n
		c.Source, c.Data = dst, nil
	}
	return nil
}

func (t *txn) cleanup() { _ = removeAll(t.dir) }

// plan resolves the change set against head (caller holds gcMu.RLock).
func (t *txn) plan(base []ManifestLayer, head *Manifest) ([]planned, RouteSummary, error) {
	s := t.s
	r := newResolver(base, head.Layers, s.stackOf(base), s.stackOf(head.Layers))
	plan, conflicts, err := r.resolve(t.changes, t.ours)
	if err != nil {
		return nil, RouteSummary{}, err
	}
	if len(conflicts) > 0 {
		return nil, RouteSummary{}, &ConflictError{Conflicts: conflicts, Head: head.Revision()}
	}
	var sum RouteSummary
	var out []planned
	for _, pl := range plan {
		if pl.route == RouteIgnored {
			sum.IgnoredCount++
		} else {
			sum.SourceCount++
		}
		eff, err := effective(r.head, pl)
		if err != nil {
			return nil, sum, err
		}
		if !eff && t.rewriteBelowHead && pl.ch.Kind == ChangeWrite {
			eff = belowHead(r.head, pl.ch.Path)
		}
		if eff {
			out = append(out, pl)
		}
	}
	return out, sum, nil
}

func (t *txn) result(plan []planned, head *Manifest, layerID string) *PublishResult {
	res := t.req.result(head)
	res.Paths, res.NoOp, res.LayerID = len(plan), len(plan) == 0, layerID
	for _, pl := range plan {
		if pl.outcome == OutcomeMerged {
			res.MergedPaths = append(res.MergedPaths, pl.ch.Path)
		}
		if pl.route == RouteIgnored {
			res.RouteSummary.IgnoredCount++
		} else {
			res.RouteSummary.SourceCount++
		}
	}
	return res
}

// publishOnce resolves against the head and commits. Without the commit lock
// it returns errStale when the head moved meanwhile.
func (s *Store) publishOnce(ctx context.Context, tx *txn, lease *Lease, locked bool) (*PublishResult, error) {
	s.gcMu.RLock()
	head := s.head.Load()
	if v := tx.req.ExpectVersion; v > 0 && head.Version != v {
		s.gcMu.RUnlock()
		return nil, &HeadMovedError{Expected: v, Head: head.Revision()}
	}
	plan, sum, err := tx.plan(lease.Layers, head)
	if err != nil {
		s.gcMu.RUnlock()
		return nil, err
	}
	if len(plan) == 0 {
		s.gcMu.RUnlock()
		// Nothing left to commit may mean an overlapping attempt of this
		// transaction committed it: then its record stands (Publish
		// replays it), and this attempt must not overwrite it with a no-op.
		if !locked {
			s.commitMu.Lock()
			defer s.commitMu.Unlock()
		}
		if _, err := s.readTx(tx.req.TxID); err == nil {
			return nil, errStale
		}
		res := tx.req.result(head)
		res.NoOp, res.RouteSummary = true, sum
		if tx.req.Keep {
			// commitMu is held here either way: Acquire would deadlock.
			l, err := s.acquireKeptLocked(tx.req)
			if err != nil {
				return nil, err
			}
			res.LeaseID = l.ID
		}
		return res, s.writeTx(res)
	}
	layerID := newID("L", head.Version+1)
	tx.layerN++
	stage := filepath.Join(tx.dir, "layer-"+strconv.Itoa(tx.layerN))
	meta, syncPaths, err := s.buildLayer(ctx, stage, head, plan, tx.req, layerID, LayerPublish)
	s.gcMu.RUnlock()
	if err != nil {
		return nil, err
	}
	if s.afterBuild != nil && !locked {
		s.afterBuild()
	}
	if !locked {
		s.commitMu.Lock()
		defer s.commitMu.Unlock()
	}
	if cur := s.head.Load(); cur != head {
		// The head moved while the layer was built. If the commits since
		// left every path of this change set alone, the plan against the
		// new head is this plan and the layer this layer: it is committed
		// there under the next version instead of being built again.
		if !rebaseOnMovedHead || tx.req.ExpectVersion > 0 || !s.untouchedSince(head, cur, tx, plan) {
			return nil, errStale // (a publish tied to one version never moves)
		}
		head, layerID = cur, newID("L", cur.Version+1)
		meta.ID, meta.ParentVersion, meta.Time = layerID, cur.Version, s.opts.Now().UTC()
		s.rebased.Add(1)
	}
	res := tx.result(plan, head, layerID)
	res.RouteSummary = sum
	res.Counts, res.Bytes = meta.Counts, meta.Bytes
	res.Revision = Revision{ManifestVersion: head.Version + 1, LayerCount: len(head.Layers) + 1}
	if _, err := s.readTx(tx.req.TxID); err == nil {
		return nil, errStale // committed by an overlapping attempt: Publish replays it
	}
	if err := s.commit(stage, head, meta, syncPaths, res, tx.req); err != nil {
		return res, err
	}
	// What is left of a committed publish's staging (its frozen copies,
	// now also linked into the layer) goes beside the answer; a crash
	// before that leaves it to Open's sweep of staging/. Counted and
	// started under commitMu, which Verify and Close hold while they wait
	// for it (nothing it does needs a lock).
	s.tidy.Add(1)
	tx.committed = true
	go func() {
		defer s.tidy.Done()
		tx.cleanup()
	}()
	return res, nil
}

// rebaseOnMovedHead: a publish whose head moved under its build commits the
// layer it built when untouchedSince allows. BenchmarkPublishSideBySide
// turns it off to compare with building the layer again.
var rebaseOnMovedHead = true

// untouchedSince reports whether cur is head with publish layers on top
// that touch no path of tx's change set, none of them a commit of tx's
// own txid (an overlapping attempt whose record is missing: Publish
// replays it). None of them may have written, deleted or replaced a path
// of the change set (whether or not the plan kept it: a change the plan
// dropped as already in the head may not be after them) or a directory
// above one; nor a path below one, unless that one is a directory the plan
// dropped (a capture lists every directory it went through, already in the
// head as it is: what is written inside it does not change its entry; one
// the plan kept, a new one, a write inside could have made). The plan's
// resolution against the head read nothing else (which paths are ignored,
// it reads from the session's base): its conflicts, merges, parent
// directories' modes and line owners are the same against cur. Any other
// kind of layer (a squash, an amend) says no.
func (s *Store) untouchedSince(head, cur *Manifest, tx *txn, plan []planned) bool {
	k := len(cur.Layers) - len(head.Layers)
	if k < 1 || cur.Version != head.Version+int64(k) {
		return false
	}
	for i, l := range head.Layers {
		if cur.Layers[k+i].ID != l.ID {
			return false
		}
	}
	kept := make(map[string]bool, len(plan))
	for _, pl := range plan {
		kept[pl.ch.Path] = true
	}
	mine := make(map[string]bool, len(tx.changes))   // every path of the change set
	covers := make(map[string]bool, len(tx.changes)) // those that decide what is below them
	above := map[string]bool{}                       // their directories
	for _, ch := range tx.changes {
		mine[ch.Path] = true
		if ch.Kind != ChangeDir || kept[ch.Path] {
			covers[ch.Path] = true
		}
		for _, a := range ancestors(ch.Path) {
			above[a] = true
		}
	}
	for _, l := range cur.Layers[:k] {
		if l.TxID == tx.req.TxID {
			return false
		}
		m, err := s.meta(l.ID)
		if err != nil || m.Kind != LayerPublish {
			return false
		}
		for _, po := range m.Paths {
			if nearPath(po.Path, mine, above, covers) {
				return false
			}
		}
	}
	return true
}

// buildLayer writes the plan as a layer in stage and returns its metadata
// and what commit must make durable before the layer can be named.
func (s *Store) buildLayer(ctx context.Context, stage string, head *Manifest, plan []planned, req PublishRequest, id string, kind LayerKind) (*LayerMeta, []string, error) {
	headDirs := s.stackOf(head.Layers)
	b, err := newBuilder(stage, headDirs)
	if err != nil {
		return nil, nil, err
	}
	meta := &LayerMeta{ID: id, Kind: kind, ParentVersion: head.Version, TxID: req.TxID, Owner: req.Owner,
		Agent: req.Agent, Message: req.Message, Time: s.opts.Now().UTC(), Blame: map[string][]BlameRange{}}
	for _, pl := range plan {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if pl.ch.Kind == ChangeWrite {
			ranges, err := s.blameWrite(head, headDirs, pl, req.Owner)
			if err != nil {
				return nil, nil, err
			}
			if ranges != nil {
				meta.Blame[pl.ch.Path] = ranges
			}
		}
		if err := b.add(pl, false); err != nil {
			return nil, nil, fmt.Errorf("build layer %s: %w", pl.ch.Path, err)
		}
		meta.Paths = append(meta.Paths, PathOutcome{Path: pl.ch.Path, Change: string(pl.ch.Kind), Outcome: pl.outcome})
	}
	meta.Digest, meta.Counts, meta.Bytes = b.digest(), b.counts, b.bytes
	return meta, b.syncPaths(), nil
}

// commit publishes a staged layer. The manifest rename is the commit point;
// everything before it is invisible and swept after a crash, everything
// after it is re-derivable from the layer's metadata.
//
// Before that rename, one flush (syncBatch) makes durable together the
// layer's entries, its rename into layers/, its metadata and the next
// manifest (written in staging); the rename and one fsync of the root then
// commit. A power cut before the flush completes leaves the old manifest;
// after it, the new manifest can only name what is already on disk.
func (s *Store) commit(stage string, head *Manifest, meta *LayerMeta, syncPaths []string, res *PublishResult, req PublishRequest) error {
	committed := false // past the commit point: the manifest names the layer
	sb := &syncBatch{syncfs: len(syncPaths) > commitSyncfsAbove}
	defer sb.close()
	for _, p := range syncPaths {
		if err := sb.add(p); err != nil {
			return fmt.Errorf("commit layer %s: %w", meta.ID, err)
		}
	}
	s.hit(FailAfterStaging)
	dst := filepath.Join(s.root, dirLayers, meta.ID)
	if err := os.Rename(stage, dst); err != nil {
		return fmt.Errorf("commit layer %s: %w", meta.ID, err)
	}
	if err := sb.add(filepath.Join(s.root, dirLayers)); err != nil {
		return err
	}
	s.hit(FailAfterRename)
	next := head.clone()
	next.Version++
	next.Layers = append([]ManifestLayer{{ID: meta.ID, Path: dirLayers + "/" + meta.ID, TxID: req.TxID}}, next.Layers...)
	res.Revision = next.Revision()
	meta.Result = res
	mf, err := s.createMetaUnsynced(meta)
	if err != nil {
		return err
	}
	sb.addFile(mf)
	if err := sb.add(filepath.Join(s.root, dirMeta)); err != nil {
		return err
	}
	s.hit(FailAfterMeta)
	mb, err := manifestBytes(next)
	if err != nil {
		return err
	}
	pending := filepath.Join(filepath.Dir(stage), "manifest-"+meta.ID+".json")
	pf, err := createUnsynced(pending, mb, 0o644)
	if err != nil {
		return fmt.Errorf("commit manifest: %w", err)
	}
	sb.addFile(pf)
	if rec := req.Record; rec != nil {
		err := s.Injected(FailCommitRecord)
		if err == nil {
			err = rec.write(sb)
		}
		if err != nil {
			s.log.Warn("the publish's own record could not be written with its commit", "txid", req.TxID, "path", rec.Path, "err", err)
			if rec.Written {
				_ = os.Remove(rec.Path)
				rec.Written = false
			}
		} else {
			defer func() {
				if !committed {
					_ = os.Remove(rec.Path)
					rec.Written = false
				}
			}()
		}
	}
	if err := sb.flush(s.root); err != nil {
		return fmt.Errorf("commit layer %s: %w", meta.ID, err)
	}
	s.hit(FailAfterSync)
	if err := os.Rename(pending, filepath.Join(s.root, "manifest.json")); err != nil {
		return fmt.Errorf("commit manifest: %w", err)
	}
	committed = true
	// The manifest on disk names the layer now: the in-memory head must
	// too, or a later commit would build on the old head and drop it.
	s.head.Store(next)
	if err := atomicfile.SyncDir(s.root); err != nil {
		return fmt.Errorf("commit manifest: %w", err)
	}
	s.hit(FailAfterManifest)
	s.appendAudit(meta)
	s.hit(FailAfterAudit)
	if req.Keep {
		l, err := s.acquireKeptLocked(req)
		if err != nil {
			return fmt.Errorf("committed %s, but re-leasing failed: %w", meta.ID, err)
		}
		res.LeaseID = l.ID
	}
	if err := s.writeTxUnsynced(res); err != nil {
		s.log.Warn("transaction record", "txid", req.TxID, "err", err)
	}
	s.hit(FailAfterTx)
	s.log.Info("layer committed", "layer_id", meta.ID, "txid", req.TxID, "owner", req.Owner,
		"manifest_version", next.Version, "paths", len(meta.Paths))
	return nil
}
