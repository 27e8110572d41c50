package layerstack

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// SquashResult reports what a squash folded (the seed's result shape).
type SquashResult struct {
	ManifestVersion int64           `json:"manifest_version"`
	SquashedBlocks  []SquashedBlock `json:"squashed_blocks"`
}

// SquashedBlock is one run of layers replaced by one squashed layer.
type SquashedBlock struct {
	SquashedLayerID  string   `json:"squashed_layer_id"`
	ReplacedLayerIDs []string `json:"replaced_layer_ids"`
	// ReplacedLayers is "reclaimed" when the old layers were deleted, or
	// "leased" when a live session still mounts them.
	ReplacedLayers string `json:"replaced_layers"`
}

// squashPlan is the blocks to fold, each a run of manifest layers.
func squashPlan(m *Manifest, leases []*Lease) [][]ManifestLayer {
	boundary := map[string]bool{}
	for _, l := range leases {
		if len(l.Layers) > 0 {
			boundary[l.Layers[0].ID] = true
		}
	}
	var blocks [][]ManifestLayer
	var run []ManifestLayer
	flush := func() {
		if len(run) >= 2 {
			blocks = append(blocks, run)
		}
		run = nil
	}
	for i, l := range m.Layers {
		if i == len(m.Layers)-1 || boundary[l.ID] {
			flush() // the base and every lease's newest layer stay as they are
			continue
		}
		run = append(run, l)
	}
	flush()
	return blocks
}

// Squash folds every run of two or more layers between live-lease boundaries
// into one layer (files hardlinked from the old layers, one syncfs), never
// touching the base. Layers no lease needs any more are deleted.
func (s *Store) Squash(ctx context.Context) (*SquashResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	s.squashing.Store(true)
	defer s.squashing.Store(false)
	s.squashMu.Lock()
	defer s.squashMu.Unlock()

	head := s.head.Load()
	if head == nil {
		return nil, ErrNoManifest
	}
	blocks := squashPlan(head, s.Leases())
	res := &SquashResult{ManifestVersion: head.Version, SquashedBlocks: []SquashedBlock{}}
	if len(blocks) == 0 {
		return res, nil
	}
	stageRoot, err := os.MkdirTemp(filepath.Join(s.root, dirStaging), "squash-")
	if err != nil {
		return nil, err
	}
	defer removeAll(stageRoot)
	metas := make([]*LayerMeta, len(blocks))
	for i, blk := range blocks {
		id := newID("S", head.Version+1)
		meta, err := s.foldBlock(ctx, head, blk, filepath.Join(stageRoot, id), id)
		if err != nil {
			return nil, fmt.Errorf("squash: %w", err)
		}
		metas[i] = meta
	}
	if err := syncFS(stageRoot); err != nil {
		return nil, err
	}

	s.commitMu.Lock()
	next, err := s.commitSquash(stageRoot, blocks, metas)
	s.commitMu.Unlock()
	if err != nil {
		return nil, err
	}
	removed, err := s.collectGarbage()
	if err != nil {
		return nil, err
	}
	gone := map[string]bool{}
	for _, r := range removed {
		gone[r] = true
	}
	res.ManifestVersion = next.Version
	for i, blk := range blocks {
		b := SquashedBlock{SquashedLayerID: metas[i].ID, ReplacedLayers: "reclaimed"}
		for _, l := range blk {
			b.ReplacedLayerIDs = append(b.ReplacedLayerIDs, l.ID)
			if !gone[l.ID] {
				b.ReplacedLayers = "leased"
			}
		}
		res.SquashedBlocks = append(res.SquashedBlocks, b)
	}
	s.log.Info("squashed", "blocks", len(blocks), "manifest_version", next.Version)
	return res, nil
}

func (s *Store) foldBlock(ctx context.Context, head *Manifest, blk []ManifestLayer, dst, id string) (*LayerMeta, error) {
	pos := 0
	for i, l := range head.Layers {
		if l.ID == blk[0].ID {
			pos = i
		}
	}
	below := s.stackOf(head.Layers[pos+len(blk):])
	sink := &dirSink{root: dst}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return nil, err
	}
	f := &folder{ctx: ctx, run: s.stackOf(blk), below: below, sink: sink}
	if err := f.fold(); err != nil {
		return nil, err
	}
	sink.restoreDirTimes()
	digest, counts, bytes, err := treeDigest(dst)
	if err != nil {
		return nil, err
	}
	meta := &LayerMeta{ID: id, Kind: LayerSquash, ParentVersion: head.Version, Owner: "squash",
		Time: s.opts.Now().UTC(), Digest: digest, Counts: counts, Bytes: bytes, Blame: map[string][]BlameRange{}}
	for _, l := range blk {
		meta.Replace = append(meta.Replace, l.ID)
		lm, err := s.meta(l.ID)
		if err != nil {
			continue
		}
		for p, r := range lm.Blame {
			if _, ok := meta.Blame[p]; !ok {
				meta.Blame[p] = r
			}
		}
	}
	return meta, nil
}

// commitSquash splices each block's squashed layer into the current head.
// Publishes only ever prepend, so a planned run is still contiguous.
func (s *Store) commitSquash(stageRoot string, blocks [][]ManifestLayer, metas []*LayerMeta) (*Manifest, error) {
	head := s.head.Load()
	next := head.clone()
	next.Version++
	for i, blk := range blocks {
		at := -1
		for j, l := range next.Layers {
			if l.ID == blk[0].ID {
				at = j
			}
		}
		if at < 0 || at+len(blk) > len(next.Layers) {
			return nil, fmt.Errorf("squash: block %s is no longer in the manifest", blk[0].ID)
		}
		for k, l := range blk {
			if next.Layers[at+k].ID != l.ID {
				return nil, fmt.Errorf("squash: block %s is no longer contiguous", blk[0].ID)
			}
		}
		id := metas[i].ID
		spliced := append([]ManifestLayer{}, next.Layers[:at]...)
		spliced = append(spliced, ManifestLayer{ID: id, Path: dirLayers + "/" + id})
		next.Layers = append(spliced, next.Layers[at+len(blk):]...)
	}
	for _, m := range metas {
		if err := os.Rename(filepath.Join(stageRoot, m.ID), filepath.Join(s.root, dirLayers, m.ID)); err != nil {
			return nil, err
		}
		if err := s.writeMeta(m); err != nil {
			return nil, err
		}
	}
	if err := atomicfile.SyncDir(filepath.Join(s.root, dirLayers)); err != nil {
		return nil, err
	}
	for _, blk := range blocks {
		if err := s.syncTxRecords(blk); err != nil {
			return nil, err
		}
	}
	s.hit(FailSquashCommit)
	if err := writeManifest(s.root, next); err != nil {
		return nil, err
	}
	s.head.Store(next)
	return next, nil
}

// maybeAutoSquash starts a background squash past the threshold.
func (s *Store) maybeAutoSquash() {
	m := s.head.Load()
	if s.opts.AutoSquashAt <= 0 || m == nil || len(m.Layers) <= s.opts.AutoSquashAt || s.squashing.Load() {
		return
	}
	go func() {
		if s.closed.Load() {
			return
		}
		if _, err := s.Squash(context.Background()); err != nil {
			s.log.Warn("autosquash failed", "err", err)
		}
	}()
}

// dirSink writes a fold as a layer directory, hardlinking regular files from
// the immutable source layers.
type dirSink struct {
	root     string
	dirTimes []dirTime
}

type dirTime struct {
	path string
	t    time.Time
}

func (d *dirSink) dir(p string, fi fs.FileInfo, opaque bool) error {
	full := fullPath(d.root, p)
	if err := os.Mkdir(full, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(full, fi.Mode().Perm()); err != nil {
		return err
	}
	d.dirTimes = append(d.dirTimes, dirTime{full, fi.ModTime()})
	if opaque {
		return markOpaque(full)
	}
	return nil
}

func (d *dirSink) file(p, src string, _ fs.FileInfo) error {
	return linkOrCopy(src, fullPath(d.root, p))
}

func (d *dirSink) symlink(p, target string, _ fs.FileInfo) error {
	return os.Symlink(target, fullPath(d.root, p))
}

func (d *dirSink) whiteout(p string) error { return writeWhiteout(fullPath(d.root, p)) }

func (d *dirSink) restoreDirTimes() {
	for i := len(d.dirTimes) - 1; i >= 0; i-- {
		_ = os.Chtimes(d.dirTimes[i].path, d.dirTimes[i].t, d.dirTimes[i].t)
	}
}
