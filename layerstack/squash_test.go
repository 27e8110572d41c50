package layerstack

import (
	"github.com/ephemeral-sandbox/sandbox/archive"

	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// publishHistory lays down layers with every kind of change, so a fold has
// whiteouts, opaque dirs, replaced types and modes to get right.
func publishHistory(t *testing.T, s *Store) {
	t.Helper()
	steps := []*ChangeSet{
		writes("a.txt", "a1\n", "dir/x.txt", "x1\n"),
		{Changes: []Change{{Path: "base.txt", Kind: ChangeDelete}}},
		{Changes: []Change{{Path: "tree", Kind: ChangeOpaque, Mode: 0o750}, {Path: "tree/only.txt", Kind: ChangeWrite, Mode: 0o644, Data: []byte("only\n")}}},
		writes("a.txt", "a2\n"),
		{Changes: []Change{{Path: "dir", Kind: ChangeDelete}}},
		{Changes: []Change{{Path: "dir", Kind: ChangeWrite, Mode: 0o755, Data: []byte("dir is a file now\n")}}},
		{Changes: []Change{{Path: "ln", Kind: ChangeSymlink, Target: "a.txt"}}},
		writes("tmp.txt", "temporary\n"),
		{Changes: []Change{{Path: "tmp.txt", Kind: ChangeDelete}}},
		{Changes: []Change{{Path: "keep/sub", Kind: ChangeDir, Mode: 0o700}, {Path: "keep/sub/k.txt", Kind: ChangeWrite, Mode: 0o600, Data: []byte("k\n")}}},
	}
	for i, cs := range steps {
		l := mustLease(t, s, "operation:h")
		_, err := s.Publish(context.Background(), PublishRequest{TxID: fmt.Sprintf("hist-%d", i), LeaseID: l.ID, Changes: cs, Owner: "operation:h"})
		require.NoError(t, err, "step %d", i)
		require.NoError(t, s.Release(l.ID))
	}
}

func historyBase() tree {
	return tree{"base.txt": "base\n", "tree/old1.txt": "o1\n", "tree/old2/x": "o2\n", "keep/k0.txt": "k0\n"}
}

func TestSquashFoldsRunsAndKeepsContent(t *testing.T) {
	s := newTestStore(t, historyBase(), Options{AutoSquashAt: -1})
	publishHistory(t, s)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 11)
	want := readTree(t, s.Head())

	res, err := s.Squash(context.Background())
	require.NoError(t, err)
	require.Len(t, res.SquashedBlocks, 1)
	require.Len(t, res.SquashedBlocks[0].ReplacedLayerIDs, 10)
	require.Equal(t, "reclaimed", res.SquashedBlocks[0].ReplacedLayers)
	m, _ = s.Manifest()
	require.Len(t, m.Layers, 2, "one squashed layer over the base")
	require.Equal(t, want, readTree(t, s.Head()))
	requireHealthy(t, s)
	ents, _ := os.ReadDir(filepath.Join(s.Root(), dirLayers))
	require.Len(t, ents, 1, "replaced layers were collected")

	// Blame survives the squash.
	b, err := s.Blame("a.txt")
	require.NoError(t, err)
	require.Equal(t, []BlameRange{{Start: 1, Count: 1, Owner: "operation:h"}}, b)
}

func TestSquashRespectsLeaseBoundaries(t *testing.T) {
	s := newTestStore(t, historyBase(), Options{AutoSquashAt: -1})
	publishHistory(t, s)
	mid := mustLease(t, s, sess1) // pins the head after 10 layers
	midTree := readTree(t, func() *View { v, _ := s.View(mid.ID); return v }())
	for i := 0; i < 3; i++ {
		l := mustLease(t, s, sess2)
		_, err := publishOn(t, s, l, sess2, writes(fmt.Sprintf("late%d.txt", i), "late\n"))
		require.NoError(t, err)
		require.NoError(t, s.Release(l.ID))
	}
	want := readTree(t, s.Head())
	res, err := s.Squash(context.Background())
	require.NoError(t, err)
	require.Len(t, res.SquashedBlocks, 2, "one run above the leased layer, one below")
	for _, b := range res.SquashedBlocks {
		require.NotContains(t, b.ReplacedLayerIDs, mid.Layers[0].ID)
	}
	require.Equal(t, want, readTree(t, s.Head()))
	v, err := s.View(mid.ID)
	require.NoError(t, err)
	require.Equal(t, midTree, readTree(t, v), "the leased session still reads its layers")
	requireHealthy(t, s)

	// A publish from the old lease still resolves after the squash.
	_, err = publishOn(t, s, mid, sess1, writes("a.txt", "from mid\n"))
	require.NoError(t, err)
	require.Equal(t, "from mid\n", headFile(t, s, "a.txt"))
}

func TestAutoSquashPastThreshold(t *testing.T) {
	s := newTestStore(t, tree{"a": "a"}, Options{AutoSquashAt: 5})
	for i := 0; i < 12; i++ {
		_, err := publishOn(t, s, mustLease(t, s, sess1), sess1, writes(fmt.Sprintf("f%d", i), "x"))
		require.NoError(t, err)
		for _, l := range s.Leases() {
			require.NoError(t, s.Release(l.ID))
		}
	}
	require.Eventually(t, func() bool {
		m, _ := s.Manifest()
		return len(m.Layers) <= 6 && !s.squashing.Load()
	}, 10e9, 10e6)
	for i := 0; i < 12; i++ {
		require.Equal(t, "x", headFile(t, s, fmt.Sprintf("f%d", i)))
	}
}

func TestExportFormatsReproduceTheHead(t *testing.T) {
	s := newTestStore(t, historyBase(), Options{AutoSquashAt: -1})
	publishHistory(t, s)
	want := readTree(t, s.Head())
	for _, format := range []ExportFormat{ExportTar, ExportTarZst} {
		t.Run(string(format), func(t *testing.T) {
			var buf bytes.Buffer
			res, err := s.Export(context.Background(), &buf, format)
			require.NoError(t, err)
			require.Len(t, res.LayersExported, 10)
			require.Equal(t, 1, res.Entries.Opaques)
			require.Positive(t, res.Entries.Whiteouts)
			dest := t.TempDir()
			writeTree(t, dest, historyBase())
			_, err = archive.ApplyTar(context.Background(), &buf, dest, archive.ApplyOptions{Mode: archive.ApplyChanges})
			require.NoError(t, err)
			require.Equal(t, want, dirTree(t, dest))
		})
	}
	t.Run("dir", func(t *testing.T) {
		dest := t.TempDir()
		writeTree(t, dest, historyBase())
		_, rep, err := s.ExportToDir(context.Background(), dest)
		require.NoError(t, err)
		require.Positive(t, rep.FilesWritten)
		require.Equal(t, want, dirTree(t, dest))
	})
	t.Run("patch", func(t *testing.T) {
		var buf bytes.Buffer
		_, err := s.Export(context.Background(), &buf, ExportPatch)
		require.NoError(t, err)
		dest := t.TempDir()
		writeTree(t, dest, historyBase())
		cmd := exec.Command("git", "apply", "--whitespace=nowarn", "-")
		cmd.Dir, cmd.Stdin = dest, &buf
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git apply: %s\n%s", out, buf.String())
		got := dirTree(t, dest)
		// git tracks neither empty directories nor directory modes.
		for k := range want {
			if k[len(k)-1] == '/' {
				delete(want, k)
			}
		}
		for k := range got {
			if k[len(k)-1] == '/' {
				delete(got, k)
			}
		}
		require.Equal(t, want, got)
	})
}

// TestPublishSquashesAtMaxDepth: with autosquash off, a publish onto a head
// MaxDepth layers deep squashes first, so the head never grows past what a
// session can mount; when leases pin every layer, the publish is refused
// with ErrTooDeep and nothing is committed.
func TestPublishSquashesAtMaxDepth(t *testing.T) {
	s := newTestStore(t, historyBase(), Options{AutoSquashAt: -1, MaxDepth: 5})
	for i := 0; i < 12; i++ {
		l := mustLease(t, s, sess1)
		_, err := publishOn(t, s, l, sess1, writes(fmt.Sprintf("f%d.txt", i), "x\n"))
		require.NoError(t, err)
		require.NoError(t, s.Release(l.ID))
		m, _ := s.Manifest()
		require.LessOrEqual(t, len(m.Layers), 5, "after publish %d", i)
	}
	got := readTree(t, s.Head())
	for i := 0; i < 12; i++ {
		require.Equal(t, "x\n", got[fmt.Sprintf("f%d.txt", i)])
	}
	requireHealthy(t, s)

	// Pin every version: nothing can fold.
	var held []*Lease
	for i := 0; ; i++ {
		l := mustLease(t, s, sess2)
		held = append(held, l)
		before, _ := s.Manifest()
		_, err := publishOn(t, s, l, sess2, writes(fmt.Sprintf("p%d.txt", i), "p\n"))
		if err != nil {
			require.ErrorIs(t, err, ErrTooDeep)
			after, _ := s.Manifest()
			require.Equal(t, before.Version, after.Version, "a refused publish commits nothing")
			require.NotContains(t, readTree(t, s.Head()), fmt.Sprintf("p%d.txt", i))
			break
		}
		require.Less(t, i, 10, "leases pin every layer: the publish must be refused before this")
	}
	for _, l := range held {
		require.NoError(t, s.Release(l.ID))
	}
	l := mustLease(t, s, sess2)
	_, err := publishOn(t, s, l, sess2, writes("after.txt", "a\n"))
	require.NoError(t, err, "with the leases released the squash folds and the publish goes through")
}

// A release collects garbage only when it frees a layer: one a squash
// replaced that no other lease pins. The releases before it (a lease on
// the head, a lease whose replaced layers another still pins) leave the
// layer directories alone, garbage planted there included; the last one
// collects the replaced layers and the planted one.
func TestReleaseCollectsOnlyWhatItFrees(t *testing.T) {
	s := newTestStore(t, historyBase(), Options{AutoSquashAt: -1})
	publishHistory(t, s)
	a, b := mustLease(t, s, sess1), mustLease(t, s, sess2)
	want := readTree(t, func() *View { v, _ := s.View(a.ID); return v }())
	res, err := s.Squash(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, res.SquashedBlocks)
	layers := func() []string {
		ents, err := os.ReadDir(filepath.Join(s.Root(), dirLayers))
		require.NoError(t, err)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	pinned := layers()
	planted := filepath.Join(s.Root(), dirLayers, "L999999-deadbeef")
	require.NoError(t, os.MkdirAll(planted, 0o755))

	onHead := mustLease(t, s, "operation:h")
	require.NoError(t, s.Release(onHead.ID))
	require.DirExists(t, planted, "a lease on the head frees nothing: no collection")
	require.NoError(t, s.Release(a.ID))
	require.DirExists(t, planted, "the replaced layers are still b's: no collection")
	require.ElementsMatch(t, append(append([]string(nil), pinned...), "L999999-deadbeef"), layers())
	v, err := s.View(b.ID)
	require.NoError(t, err)
	require.Equal(t, want, readTree(t, v), "b still reads its layers")

	require.NoError(t, s.Release(b.ID))
	require.NoDirExists(t, planted, "the last release of the replaced layers collects")
	m, err := s.Manifest()
	require.NoError(t, err)
	require.Len(t, layers(), len(m.Layers)-1, "only the head's layers are left (the base is not in layers/)")
	requireHealthy(t, s)
}

// A lease held in memory (Hold) pins its layers as any lease does: a squash
// that replaces them leaves them on disk until it is released, and its
// release collects them. It writes no file, and a reopened store does not
// have it.
func TestHoldPinsInMemoryOnly(t *testing.T) {
	s := newTestStore(t, historyBase(), Options{AutoSquashAt: -1})
	publishHistory(t, s)
	h, err := s.Hold(warmOwner)
	require.NoError(t, err)
	want := readTree(t, func() *View { v, _ := s.View(h.ID); return v }())
	leaseFiles := func() int {
		ents, err := os.ReadDir(filepath.Join(s.Root(), dirLeases))
		require.NoError(t, err)
		return len(ents)
	}
	require.Zero(t, leaseFiles(), "nothing written")
	_, err = s.Squash(context.Background())
	require.NoError(t, err)
	v, err := s.View(h.ID)
	require.NoError(t, err)
	require.Equal(t, want, readTree(t, v), "the held layers outlive the squash")
	requireHealthy(t, s)
	require.NoError(t, s.Release(h.ID))
	m, err := s.Manifest()
	require.NoError(t, err)
	ents, err := os.ReadDir(filepath.Join(s.Root(), dirLayers))
	require.NoError(t, err)
	require.Len(t, ents, len(m.Layers)-1, "released, the replaced layers are collected")

	h2, err := s.Hold(warmOwner)
	require.NoError(t, err)
	s2 := reopen(t, s)
	_, err = s2.Lease(h2.ID)
	require.ErrorIs(t, err, ErrUnknownLease, "gone with the process")
}

const warmOwner = "warm:ws-1"
