package layerstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// Verify checks the store's invariants and returns every problem found (an
// empty list means healthy): the manifest on disk is the head, every layer it
// or a lease names exists with metadata whose digest matches the layer's
// content, every committed transaction has its record, and nothing is left
// in staging or unreferenced in layers/. Run it on a quiet store.
func (s *Store) Verify(ctx context.Context) ([]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.tidy.Wait() // staging that committed publishes are still removing is no problem
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	var problems []string
	bad := func(f string, a ...any) { problems = append(problems, fmt.Sprintf(f, a...)) }
	disk, err := readManifest(s.root)
	if err != nil {
		bad("manifest: %v", err)
		return problems, nil
	}
	if mem := s.head.Load(); mem == nil || mem.Version != disk.Version || mem.RootHash() != disk.RootHash() {
		bad("manifest on disk (version %d) is not the head in memory", disk.Version)
	}
	referenced := map[string]ManifestLayer{}
	for _, l := range disk.Layers {
		referenced[l.ID] = l
	}
	for _, l := range s.Leases() {
		for _, ly := range l.Layers {
			if _, err := os.Stat(s.layerDir(ly)); err != nil {
				bad("lease %s pins missing layer %s", l.ID, ly.ID)
			}
			referenced[ly.ID] = ly
		}
	}
	for id, l := range referenced {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		meta, err := s.meta(id)
		if err != nil {
			bad("layer %s has no metadata: %v", id, err)
			continue
		}
		digest, _, _, err := treeDigest(s.layerDir(l))
		if err != nil {
			bad("layer %s unreadable: %v", id, err)
			continue
		}
		if digest != meta.Digest {
			bad("layer %s content digest %s does not match its metadata %s", id, digest[:12], meta.Digest[:min(12, len(meta.Digest))])
		}
	}
	for _, l := range disk.Layers {
		if l.TxID == "" {
			continue
		}
		if _, err := s.readTx(l.TxID); err != nil {
			bad("transaction %s of layer %s has no record", l.TxID, l.ID)
		}
	}
	for _, dir := range []string{dirStaging, dirLayers} {
		ents, err := os.ReadDir(filepath.Join(s.root, dir))
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if dir == dirStaging {
				bad("staging holds %s", e.Name())
			} else if _, ok := referenced[e.Name()]; !ok {
				bad("layer %s is referenced by no manifest or lease", e.Name())
			}
		}
	}
	return problems, nil
}
