package layerstack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const sess1, sess2 = "workspace_session:s1", "workspace_session:s2"

func TestPublishCommitsOneLayerAndDedupesTxID(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "a\n", "run.sh*": "#!/bin/sh\n"})
	l := mustLease(t, s, sess1)
	cs := writes("a.txt", "a2\n", "new/b.txt", "b\n")
	req := PublishRequest{TxID: "tx-once", LeaseID: l.ID, Changes: cs, Owner: sess1, Agent: "claude", Message: "edit"}
	r1, err := s.Publish(context.Background(), req)
	require.NoError(t, err)
	require.False(t, r1.NoOp)
	require.Equal(t, int64(2), r1.Revision.ManifestVersion)
	require.Equal(t, 2, r1.Revision.LayerCount)
	require.Equal(t, "a2\n", headFile(t, s, "a.txt"))
	require.Equal(t, "b\n", headFile(t, s, "new/b.txt"))

	r2, err := s.Publish(context.Background(), req)
	require.NoError(t, err)
	require.True(t, r2.Replayed)
	require.Equal(t, r1.LayerID, r2.LayerID)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 2, "a replayed txid writes nothing")

	meta, err := s.LayerMeta(r1.LayerID)
	require.NoError(t, err)
	require.Equal(t, sess1, meta.Owner)
	require.Equal(t, "claude", meta.Agent)
	require.Equal(t, "tx-once", meta.TxID)
	require.Equal(t, int64(1), meta.ParentVersion)
	require.Equal(t, 2, meta.Counts.Files)
	hist, err := s.History(0)
	require.NoError(t, err)
	require.Len(t, hist, 1)
	require.Equal(t, "tx-once", hist[0].TxID)
	requireHealthy(t, s)
}

func TestPublishWithoutEffectiveChangeCreatesNoLayer(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "a\n"})
	l := mustLease(t, s, sess1)
	r, err := publishOn(t, s, l, sess1, writes("a.txt", "a\n"))
	require.NoError(t, err)
	require.True(t, r.NoOp)
	r, err = publishOn(t, s, l, sess1, &ChangeSet{Changes: []Change{{Path: "gone", Kind: ChangeDelete}}})
	require.NoError(t, err)
	require.True(t, r.NoOp)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 1)
}

func TestDisjointEditsMergeInEitherOrder(t *testing.T) {
	base := lines(20, func(i int) string { return "line " + string(rune('a'+i)) })
	for _, order := range [][2]int{{0, 1}, {1, 0}} {
		s := newTestStore(t, tree{"f.txt": base})
		ls := []*Lease{mustLease(t, s, sess1), mustLease(t, s, sess2)}
		edits := []*ChangeSet{
			writes("f.txt", strings.Replace(base, "line c", "LINE C", 1)),
			writes("f.txt", strings.Replace(base, "line q", "LINE Q", 1)),
		}
		for _, i := range order {
			_, err := publishOn(t, s, ls[i], "workspace_session:x", edits[i])
			require.NoError(t, err)
		}
		got := headFile(t, s, "f.txt")
		require.Equal(t, strings.Replace(strings.Replace(base, "line c", "LINE C", 1), "line q", "LINE Q", 1), got)
	}
}

func TestExecBitSurvivesMergedWrite(t *testing.T) {
	s := newTestStore(t, tree{"run.sh*": "#!/bin/sh\necho 1\necho 2\necho 3\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	cs1 := &ChangeSet{Changes: []Change{{Path: "run.sh", Kind: ChangeWrite, Mode: 0o755, Data: []byte("#!/bin/sh\necho ONE\necho 2\necho 3\n")}}}
	cs2 := &ChangeSet{Changes: []Change{{Path: "run.sh", Kind: ChangeWrite, Mode: 0o755, Data: []byte("#!/bin/sh\necho 1\necho 2\necho THREE\n")}}}
	_, err := publishOn(t, s, l1, sess1, cs1)
	require.NoError(t, err)
	r, err := publishOn(t, s, l2, sess2, cs2)
	require.NoError(t, err)
	require.Equal(t, []string{"run.sh"}, r.MergedPaths)
	e, err := s.Head().Stat("run.sh")
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), e.Mode)
	require.Equal(t, "#!/bin/sh\necho ONE\necho 2\necho THREE\n", headFile(t, s, "run.sh"))
}

func requireConflict(t *testing.T, err error, path, kind string) *ConflictError {
	t.Helper()
	var ce *ConflictError
	require.True(t, errors.As(err, &ce), "want a conflict, got %v", err)
	for _, c := range ce.Conflicts {
		if c.Path == path {
			require.Equal(t, kind, c.Kind, "conflict %+v", c)
			return ce
		}
	}
	t.Fatalf("no conflict on %s in %+v", path, ce.Conflicts)
	return nil
}

// TestConflictTable walks the rows of the seed's conflict table (seed-spec
// §5.5): a head change is published first, then "ours", made on the base.
func TestConflictTable(t *testing.T) {
	big := strings.Repeat("x", MergeMaxBytes+1)
	base := tree{
		"f.txt":        "1\n2\n3\n4\n5\n",
		"bin.dat":      "\x00\x01\x02",
		"big.txt":      big,
		"link":         "->f.txt",
		"d/":           "",
		"d/inner.txt":  "in\n",
		"e/":           "",
		"e/keep.txt":   "k\n",
		".gitignore":   "build/\n*.log\n",
		"build/out.o":  "obj\n",
		"app.log":      "log\n",
		"untouched.md": "u\n",
	}
	w := func(p, c string) Change { return Change{Path: p, Kind: ChangeWrite, Mode: 0o644, Data: []byte(c)} }
	cases := []struct {
		name     string
		head     []Change
		ours     []Change
		wantKind string // "" = accepted
		path     string
		check    func(t *testing.T, s *Store)
	}{
		{name: "unchanged at head: clean", head: []Change{w("untouched.md", "head\n")}, ours: []Change{w("f.txt", "ours\n")},
			check: func(t *testing.T, s *Store) { require.Equal(t, "ours\n", headFile(t, s, "f.txt")) }},
		{name: "text disjoint: merged", head: []Change{w("f.txt", "ONE\n2\n3\n4\n5\n")}, ours: []Change{w("f.txt", "1\n2\n3\n4\nFIVE\n")},
			check: func(t *testing.T, s *Store) { require.Equal(t, "ONE\n2\n3\n4\nFIVE\n", headFile(t, s, "f.txt")) }},
		{name: "text adjacent: merged", head: []Change{w("f.txt", "1\n2\nTHREE\n4\n5\n")}, ours: []Change{w("f.txt", "1\n2\n3\nFOUR\n5\n")},
			check: func(t *testing.T, s *Store) { require.Equal(t, "1\n2\nTHREE\nFOUR\n5\n", headFile(t, s, "f.txt")) }},
		{name: "text overlapping: conflict", head: []Change{w("f.txt", "1\nTWO\n3\n4\n5\n")}, ours: []Change{w("f.txt", "1\ntwo\n3\n4\n5\n")},
			wantKind: ConflictContent, path: "f.txt"},
		{name: "identical change: clean", head: []Change{w("f.txt", "same\n")}, ours: []Change{w("f.txt", "same\n")}},
		{name: "head made it a symlink", head: []Change{{Path: "f.txt", Kind: ChangeSymlink, Target: "x"}}, ours: []Change{w("f.txt", "ours\n")},
			wantKind: ConflictSymlink, path: "f.txt"},
		{name: "head made it a directory", head: []Change{{Path: "f.txt", Kind: ChangeOpaque, Mode: 0o755}, w("f.txt/x", "x")}, ours: []Change{w("f.txt", "ours\n")},
			wantKind: ConflictFileVsDir, path: "f.txt"},
		{name: "binary on both sides", head: []Change{w("bin.dat", "\x00head")}, ours: []Change{w("bin.dat", "\x00ours")},
			wantKind: ConflictBinary, path: "bin.dat"},
		{name: "too large to merge", head: []Change{w("big.txt", big+"h")}, ours: []Change{w("big.txt", big+"o")},
			wantKind: ConflictTooLarge, path: "big.txt"},
		{name: "delete vs modify", head: []Change{w("f.txt", "head\n")}, ours: []Change{{Path: "f.txt", Kind: ChangeDelete}},
			wantKind: ConflictDeleteModify, path: "f.txt"},
		{name: "modify vs delete", head: []Change{{Path: "f.txt", Kind: ChangeDelete}}, ours: []Change{w("f.txt", "ours\n")},
			wantKind: ConflictModifyDelete, path: "f.txt"},
		{name: "delete on both sides: clean", head: []Change{{Path: "f.txt", Kind: ChangeDelete}}, ours: []Change{{Path: "f.txt", Kind: ChangeDelete}}},
		{name: "symlink changed on both sides", head: []Change{{Path: "link", Kind: ChangeSymlink, Target: "h"}}, ours: []Change{{Path: "link", Kind: ChangeSymlink, Target: "o"}},
			wantKind: ConflictSymlink, path: "link"},
		{name: "opaque dir vs head change", head: []Change{w("d/inner.txt", "head\n")}, ours: []Change{{Path: "d", Kind: ChangeOpaque, Mode: 0o755}, w("d/new.txt", "n")},
			wantKind: ConflictDirectory, path: "d"},
		{name: "delete dir whose content changed", head: []Change{w("d/inner.txt", "head\n")}, ours: []Change{{Path: "d", Kind: ChangeDelete}},
			wantKind: ConflictDirectory, path: "d"},
		{name: "delete dir nobody touched: clean", head: []Change{w("f.txt", "head\n")}, ours: []Change{{Path: "e", Kind: ChangeDelete}},
			check: func(t *testing.T, s *Store) {
				_, err := s.Head().Stat("e/keep.txt")
				require.ErrorIs(t, err, os.ErrNotExist)
			}},
		{name: "both create the same directory", head: []Change{{Path: "newdir", Kind: ChangeDir, Mode: 0o755}, w("newdir/h", "h")},
			ours: []Change{{Path: "newdir", Kind: ChangeDir, Mode: 0o755}, w("newdir/o", "o")},
			check: func(t *testing.T, s *Store) {
				require.Equal(t, "h", headFile(t, s, "newdir/h"))
				require.Equal(t, "o", headFile(t, s, "newdir/o"))
			}},
		{name: "ignored path: last writer wins", head: []Change{w("build/out.o", "head\n"), w("app.log", "head\n")},
			ours: []Change{w("build/out.o", "ours\n"), w("app.log", "ours\n")},
			check: func(t *testing.T, s *Store) {
				require.Equal(t, "ours\n", headFile(t, s, "build/out.o"))
				require.Equal(t, "ours\n", headFile(t, s, "app.log"))
			}},
		{name: "protected path", ours: []Change{w("manifest.json", "{}")}, wantKind: ConflictProtected, path: "manifest.json"},
		{name: "whiteout namespace", ours: []Change{w("d/.wh.inner.txt", "")}, wantKind: ConflictProtected, path: "d/.wh.inner.txt"},
		{name: "escape", ours: []Change{w("../etc/passwd", "x")}, wantKind: ConflictInvalid, path: "../etc/passwd"},
		{name: "longer than a layer holds", ours: []Change{w(longPath, "x")}, wantKind: ConflictInvalid, path: longPath},
		{name: "parent replaced by a file", head: []Change{{Path: "e", Kind: ChangeDelete}, w("e", "file now")}, ours: []Change{w("e/new.txt", "n")},
			wantKind: ConflictParent, path: "e/new.txt"},
		{name: "both changed mode differently", head: []Change{{Path: "f.txt", Kind: ChangeWrite, Mode: 0o755, Data: []byte("1\n2\n3\n4\n5\n")}},
			ours: []Change{{Path: "f.txt", Kind: ChangeWrite, Mode: 0o600, Data: []byte("1\n2\n3\n4\nfive\n")}}, wantKind: ConflictMode, path: "f.txt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, base)
			ours := mustLease(t, s, sess1)
			if tc.head != nil {
				hl := mustLease(t, s, sess2)
				_, err := publishOn(t, s, hl, sess2, &ChangeSet{Changes: tc.head})
				require.NoError(t, err)
			}
			before, _ := s.Manifest()
			_, err := publishOn(t, s, ours, sess1, &ChangeSet{Changes: tc.ours})
			if tc.wantKind == "" {
				require.NoError(t, err)
				if tc.check != nil {
					tc.check(t, s)
				}
			} else {
				requireConflict(t, err, tc.path, tc.wantKind)
				after, _ := s.Manifest()
				require.Equal(t, before.Version, after.Version, "a rejected publish commits nothing")
			}
			requireHealthy(t, s)
		})
	}
}

func TestConflictReportCarriesLineRangesAndFingerprints(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n4\n5\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	_, err := publishOn(t, s, l1, sess1, writes("f.txt", "1\n2\nhead\n4\n5\n"))
	require.NoError(t, err)
	_, err = publishOn(t, s, l2, sess2, writes("f.txt", "1\n2\nours\nours too\n4\n5\n", "other.txt", "fine\n"))
	ce := requireConflict(t, err, "f.txt", ConflictContent)
	c := ce.Conflicts[0]
	require.Equal(t, ReasonSourceConflict, c.Reason)
	require.True(t, strings.HasPrefix(c.Base, "file:0644:"))
	require.NotEqual(t, c.Base, c.Head)
	require.NotEqual(t, c.Head, c.Ours)
	require.Len(t, c.Hunks, 1)
	require.Equal(t, LineRange{Start: 3, Count: 1}, c.Hunks[0].Base)
	require.Equal(t, LineRange{Start: 3, Count: 1}, c.Hunks[0].Head)
	require.Equal(t, LineRange{Start: 3, Count: 2}, c.Hunks[0].Ours)
	_, err = s.Head().Stat("other.txt")
	require.ErrorIs(t, err, os.ErrNotExist, "all or nothing: the clean path did not land either")
}

// Two sides that changed every other line of a file conflict in thousands
// of places: the conflict keeps the first MaxConflictHunks and their total.
// longPath is a legal workspace path (components of 2 bytes, under
// PATH_MAX) too long for a layer to hold below the store's directories.
var longPath = strings.Repeat("d/", (MaxPublishPathBytes+2)/2) + "f"

func TestConflictHunksAreCapped(t *testing.T) {
	const n = 3 * MaxConflictHunks
	base := lines(2*n, func(int) string { return "x" })
	s := newTestStore(t, tree{"f.txt": base})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	side := func(w string) string {
		return lines(2*n, func(i int) string {
			if i%2 == 0 {
				return w
			}
			return "x"
		})
	}
	_, err := publishOn(t, s, l1, sess1, writes("f.txt", side("a")))
	require.NoError(t, err)
	_, err = publishOn(t, s, l2, sess2, writes("f.txt", side("b")))
	c := requireConflict(t, err, "f.txt", ConflictContent).Conflicts[0]
	require.Len(t, c.Hunks, MaxConflictHunks)
	require.Equal(t, n, c.HunksTotal)
	require.Contains(t, c.Message, fmt.Sprint(n))
}

func TestTenConcurrentPublishersOfOneFile(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "shared line\n"})
	var leases []*Lease
	for i := 0; i < 10; i++ {
		leases = append(leases, mustLease(t, s, "workspace_session:p"))
	}
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range leases {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = s.Publish(context.Background(), PublishRequest{TxID: "conc-" + string(rune('a'+i)), LeaseID: leases[i].ID,
				Changes: writes("f.txt", "publisher "+string(rune('a'+i))+"\n"), Owner: "workspace_session:p"})
		}(i)
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		requireConflict(t, err, "f.txt", ConflictContent)
	}
	require.Equal(t, 1, ok)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 2)
	requireHealthy(t, s)
}

func TestKeepContinuesOnNewHead(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	_, err := publishOn(t, s, l2, sess2, writes("other.txt", "from s2\n"))
	require.NoError(t, err)
	r, err := s.Publish(context.Background(), PublishRequest{TxID: nextTx(), LeaseID: l1.ID, Owner: sess1, Keep: true, Changes: writes("f.txt", "1\n2\nthree\n")})
	require.NoError(t, err)
	require.NotEmpty(t, r.LeaseID)
	_, err = s.Lease(l1.ID)
	require.ErrorIs(t, err, ErrUnknownLease, "the old lease is released")
	nl, err := s.Lease(r.LeaseID)
	require.NoError(t, err)
	require.Equal(t, r.Revision.ManifestVersion, nl.ManifestVersion)
	v, err := s.View(nl.ID)
	require.NoError(t, err)
	b, _, err := v.ReadFile("other.txt", 0)
	require.NoError(t, err)
	require.Equal(t, "from s2\n", string(b), "the kept session sees the others' work")
	// ... and publishes again on top of it.
	_, err = publishOn(t, s, nl, sess1, writes("f.txt", "1\ntwo\nthree\n"))
	require.NoError(t, err)
	require.Equal(t, "1\ntwo\nthree\n", headFile(t, s, "f.txt"))
}

// A refresh copies its change set before it takes the commit lock: a
// publish of another session commits while it does, and the refresh then
// lands on the head that publish made.
func TestRefreshFreezesOutsideTheCommitLock(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "f\n"})
	l1, l2, l3 := mustLease(t, s, sess1), mustLease(t, s, sess2), mustLease(t, s, "workspace_session:s3")
	_, err := publishOn(t, s, l2, sess2, writes("g.txt", "g\n"))
	require.NoError(t, err)
	s.refreshFrozen = func() {
		done := make(chan error, 1)
		go func() {
			_, err := publishOn(t, s, l3, "workspace_session:s3", writes("h.txt", "h\n"))
			done <- err
		}()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("a publish waited for a refresh that was copying its change set")
		}
	}
	upper := filepath.Join(t.TempDir(), "upper")
	rr, err := s.Refresh(context.Background(), l1.ID, writes("mine.txt", "m\n"), upper)
	require.NoError(t, err)
	require.Equal(t, int64(3), rr.Revision.ManifestVersion, "the refresh is on the head the publish made")
	nl, err := s.Lease(rr.LeaseID)
	require.NoError(t, err)
	v := NewView(append([]string{upper}, s.LowerDirs(nl)...)...)
	for p, want := range map[string]string{"g.txt": "g\n", "h.txt": "h\n", "mine.txt": "m\n"} {
		b, _, err := v.ReadFile(p, 0)
		require.NoError(t, err)
		require.Equal(t, want, string(b))
	}
}

func TestRefreshMergesHeadUnderSessionChanges(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n4\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	_, err := publishOn(t, s, l2, sess2, writes("f.txt", "ONE\n2\n3\n4\n", "g.txt", "g\n"))
	require.NoError(t, err)
	upper := filepath.Join(t.TempDir(), "upper2")
	rr, err := s.Refresh(context.Background(), l1.ID, writes("f.txt", "1\n2\n3\nFOUR\n", "mine.txt", "m\n"), upper)
	require.NoError(t, err)
	require.Equal(t, []string{"f.txt"}, rr.MergedPaths)
	got := dirTree(t, upper)
	require.Equal(t, tree{"f.txt": "ONE\n2\n3\nFOUR\n", "mine.txt": "m\n"}, got)
	nl, err := s.Lease(rr.LeaseID)
	require.NoError(t, err)
	require.Equal(t, l1.ID, nl.Replaces, "the new lease names the one it replaced")
	require.Empty(t, nl.KeptBy)
	// The session's view = new lease + rewritten upper.
	v := NewView(append([]string{upper}, s.LowerDirs(nl)...)...)
	require.Equal(t, "g\n", func() string { b, _, _ := v.ReadFile("g.txt", 0); return string(b) }())
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 2, "refresh commits nothing")

	// A conflicting refresh changes nothing.
	_, err = publishOn(t, s, mustLease(t, s, sess2), sess2, writes("f.txt", "ONE\n2\nhead3\n4\n"))
	require.NoError(t, err)
	upper3 := filepath.Join(t.TempDir(), "upper3")
	_, err = s.Refresh(context.Background(), nl.ID, writes("f.txt", "ONE\n2\nmine3\nFOUR\n"), upper3)
	requireConflict(t, err, "f.txt", ConflictContent)
	_, err = os.Stat(upper3)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = s.Lease(nl.ID)
	require.NoError(t, err, "the lease is untouched after a failed refresh")
}

func TestCheckPublishIsADryRun(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	_, err := publishOn(t, s, l2, sess2, writes("f.txt", "one\n2\n3\n"))
	require.NoError(t, err)
	r, err := s.CheckPublish(context.Background(), PublishRequest{LeaseID: l1.ID, Changes: writes("f.txt", "1\n2\nthree\n")})
	require.NoError(t, err)
	require.True(t, r.DryRun)
	require.Equal(t, []string{"f.txt"}, r.MergedPaths)
	_, err = s.CheckPublish(context.Background(), PublishRequest{LeaseID: l1.ID, Changes: writes("f.txt", "uno\n2\n3\n")})
	requireConflict(t, err, "f.txt", ConflictContent)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 2)
}

func TestDiffShowsUnpublishedChanges(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n", "old.txt": "bye\n", "run.sh": "#!/bin/sh\n"})
	l := mustLease(t, s, sess1)
	cs := &ChangeSet{Changes: []Change{
		{Path: "f.txt", Kind: ChangeWrite, Mode: 0o644, Data: []byte("1\ntwo\n3\n")},
		{Path: "old.txt", Kind: ChangeDelete},
		{Path: "new.txt", Kind: ChangeWrite, Mode: 0o644, Data: []byte("hi\n")},
		{Path: "run.sh", Kind: ChangeWrite, Mode: 0o755, Data: []byte("#!/bin/sh\n")},
	}}
	var b strings.Builder
	sum, err := s.Diff(context.Background(), l.ID, cs, &b)
	require.NoError(t, err)
	out := b.String()
	require.Contains(t, out, "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n 1\n-2\n+two\n 3\n")
	require.Contains(t, out, "diff --git a/old.txt b/old.txt\ndeleted file mode 100644\n--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n")
	require.Contains(t, out, "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hi\n")
	require.Contains(t, out, "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n")
	require.Len(t, sum.Paths, 4)
}

func TestAmendAndEdits(t *testing.T) {
	s := newTestStore(t, tree{"run.sh*": "#!/bin/sh\necho old\n"})
	r, err := s.Amend(context.Background(), AmendRequest{TxID: "am-1", Path: "run.sh", Owner: "operation:req1",
		Edits: []Edit{{OldString: "echo old", NewString: "echo new"}}})
	require.NoError(t, err)
	require.Equal(t, 1, r.Replacements)
	require.False(t, r.Created)
	e, err := s.Head().Stat("run.sh")
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), e.Mode, "the exec bit survives an edit")
	require.Equal(t, "#!/bin/sh\necho new\n", headFile(t, s, "run.sh"))

	r, err = s.Amend(context.Background(), AmendRequest{TxID: "am-2", Path: "docs/new.md", Content: []byte("# hi\n"), Owner: "operation:req2"})
	require.NoError(t, err)
	require.True(t, r.Created)
	_, err = s.Amend(context.Background(), AmendRequest{TxID: "am-3", Path: "run.sh", Edits: []Edit{{OldString: "nope", NewString: "x"}}})
	var ee *EditError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, "not_found", ee.Reason)
	big := strings.Repeat("y", MaxEditBytes+1)
	_, err = s.Amend(context.Background(), AmendRequest{TxID: "am-4", Path: "big", Content: []byte(big)})
	require.NoError(t, err)
	_, err = s.Amend(context.Background(), AmendRequest{TxID: "am-5", Path: "big", Edits: []Edit{{OldString: "y", NewString: "z", ReplaceAll: true}}})
	var tl *TooLargeError
	require.ErrorAs(t, err, &tl)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 4)

	blame, err := s.Blame("run.sh")
	require.NoError(t, err)
	require.Equal(t, []BlameRange{{Start: 1, Count: 1, Owner: OwnerOriginal}, {Start: 2, Count: 1, Owner: "operation:req1"}}, blame)
}

func TestBlameSurvivesMerges(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n4\n5\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	_, err := publishOn(t, s, l1, sess1, writes("f.txt", "1\nTWO\n3\n4\n5\n"))
	require.NoError(t, err)
	_, err = publishOn(t, s, l2, sess2, writes("f.txt", "1\n2\n3\nFOUR\nfour and a half\n5\n"))
	require.NoError(t, err)
	b, err := s.Blame("f.txt")
	require.NoError(t, err)
	require.Equal(t, []BlameRange{
		{Start: 1, Count: 1, Owner: OwnerOriginal},
		{Start: 2, Count: 1, Owner: sess1},
		{Start: 3, Count: 1, Owner: OwnerOriginal},
		{Start: 4, Count: 2, Owner: sess2},
		{Start: 6, Count: 1, Owner: OwnerOriginal},
	}, b)
	require.NoError(t, CheckTiling(b, 6))
}

func TestOpenRefusesSecondOwner(t *testing.T) {
	s := newTestStore(t, tree{"a": "a"})
	_, err := Open(s.Root(), Options{})
	require.ErrorIs(t, err, ErrStoreLocked)
}

// reopen closes s and opens its directory again (closed at the test's end).
func reopen(t *testing.T, s *Store) *Store {
	t.Helper()
	root := s.Root()
	require.NoError(t, s.Close())
	s2, err := Open(root, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { s2.Close() })
	return s2
}

func TestLeasesPersistAcrossReopen(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	l := mustLease(t, s, sess1)
	_, err := publishOn(t, s, mustLease(t, s, sess2), sess2, writes("a", "b\n"))
	require.NoError(t, err)
	s2 := reopen(t, s)
	got, err := s2.Lease(l.ID)
	require.NoError(t, err)
	require.Equal(t, l.Layers, got.Layers)
	v, err := s2.View(l.ID)
	require.NoError(t, err)
	b, _, err := v.ReadFile("a", 0)
	require.NoError(t, err)
	require.Equal(t, "a\n", string(b), "the lease still shows its base")
}

// Attempts of one transaction that overlap (a retry started while a slow
// first attempt still runs) commit it once; each answers with its result,
// none reports a conflict with the transaction's own layer.
func TestOverlappingAttemptsOfOneTransactionCommitOnce(t *testing.T) {
	for round := 0; round < 20; round++ {
		s := newTestStore(t, tree{"f.txt": "shared line\n", "bin": "\x00\x01"})
		l := mustLease(t, s, sess1)
		req := PublishRequest{TxID: "same-tx", LeaseID: l.ID, Owner: sess1,
			Changes: &ChangeSet{Changes: append(writes("f.txt", "changed\n").Changes, writes("bin", "\x00\x02").Changes...)}}
		var wg sync.WaitGroup
		res := make([]*PublishResult, 4)
		errs := make([]error, 4)
		for i := range res {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				res[i], errs[i] = s.Publish(context.Background(), req)
			}(i)
		}
		wg.Wait()
		for i := range res {
			require.NoError(t, errs[i], "round %d attempt %d", round, i)
			require.Equal(t, res[0].LayerID, res[i].LayerID, "one layer for every attempt")
		}
		m, _ := s.Manifest()
		require.Len(t, m.Layers, 2, "committed once")
		requireHealthy(t, s)
	}
}

// A publish with keep whose changes are already in the head is a no-op that
// moves the lease onto the head; it used to deadlock on the commit lock.
func TestPublishNoOpWithKeepReturns(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "a\n"})
	lease := mustLease(t, s, "o")
	done := make(chan struct{})
	var res *PublishResult
	var err error
	var hooked int
	go func() {
		defer close(done)
		res, err = s.Publish(context.Background(), PublishRequest{TxID: nextTx(), LeaseID: lease.ID, Owner: "o", Keep: true,
			Changes: writes("a.txt", "a\n"), SourcesRead: func() { hooked++ }})
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a no-op publish with keep never returned")
	}
	require.NoError(t, err)
	require.True(t, res.NoOp)
	require.NotEmpty(t, res.LeaseID)
	require.NotEqual(t, lease.ID, res.LeaseID)
	require.Equal(t, 1, hooked, "SourcesRead runs once")
}

// TestPublishOnAMovedHead: a publish whose head moved while it built its
// layer commits that layer on the new head, without building it again,
// when the commits since touched none of its paths; when one touched a
// path of it, a directory above one, or a path below one it deletes, it is
// resolved again against the new head (a conflict, a merge) as before.
func TestPublishOnAMovedHead(t *testing.T) {
	write := func(p, data string) Change {
		return Change{Path: p, Kind: ChangeWrite, Mode: 0o644, Data: []byte(data)}
	}
	dir := func(p string, mode fs.FileMode) Change { return Change{Path: p, Kind: ChangeDir, Mode: mode} }
	mineOnly := []Change{write("a/mine.txt", "mine\n")}
	// What a capture lists: the directory the file was written in, too.
	asCaptured := []Change{dir("a", 0o755), write("a/mine.txt", "mine\n")}
	for _, tc := range []struct {
		name    string
		mine    []Change
		other   []Change
		rebased bool
		err     error
		pinned  bool // ExpectVersion: commit on the head it was planned on or not at all
		sameTx  bool // the other commit is an overlapping attempt of this txid, its record lost
		takenTx bool // the other commit is another owner's under this txid
	}{
		{name: "another directory", mine: mineOnly, other: []Change{write("b/other.txt", "o\n")}, rebased: true},
		{name: "a sibling", mine: mineOnly, other: []Change{write("a/x.txt", "x2\n")}, rebased: true},
		{name: "a sibling, both as captured", mine: asCaptured, other: []Change{dir("a", 0o755), write("a/x.txt", "x2\n")}, rebased: true},
		// Which paths a publish ignores comes from its session's base.
		{name: "an ignore file", mine: mineOnly, other: []Change{write(".gitignore", "*.txt\n")}, rebased: true},
		{name: "the same path", mine: mineOnly, other: []Change{write("a/mine.txt", "theirs\n")}, err: ErrConflict},
		{name: "the directory above", mine: mineOnly, other: []Change{dir("a", 0o700)}},
		{name: "below a directory it deletes", mine: []Change{{Path: "b", Kind: ChangeDelete}, write("a/mine.txt", "mine\n")},
			other: []Change{write("b/y2.txt", "y2\n")}, err: ErrConflict},
		{name: "pinned to its version", mine: mineOnly, other: []Change{write("b/other.txt", "o\n")}, pinned: true},
		// A directory it makes, which a write inside it makes too.
		{name: "inside a directory it makes", mine: []Change{dir("n", 0o755), write("a/mine.txt", "mine\n")}, other: []Change{write("n/x.txt", "x\n")}},
		{name: "its own txid", mine: mineOnly, other: []Change{write("b/other.txt", "o\n")}, sameTx: true},
		{name: "its txid, another owner's", mine: mineOnly, other: []Change{write("b/other.txt", "o\n")}, takenTx: true, err: ErrTxTaken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, tree{"a/x.txt": "x\n", "b/y.txt": "y\n"})
			mine, theirs := mustLease(t, s, sess1), mustLease(t, s, sess2)
			txid := nextTx()
			builds, moving := 0, false
			s.afterBuild = func() {
				if moving {
					return // the other publish's own build
				}
				builds++
				if builds == 1 { // the head moves once, under the first build
					moving = true
					otherTx, owner, lease := nextTx(), sess2, theirs
					if tc.sameTx || tc.takenTx {
						otherTx = txid
					}
					if tc.sameTx { // the same session's other attempt
						owner, lease = sess1, mustLease(t, s, sess1)
					}
					_, err := s.Publish(context.Background(), PublishRequest{TxID: otherTx, LeaseID: lease.ID, Changes: &ChangeSet{Changes: tc.other}, Owner: owner})
					moving = false
					require.NoError(t, err)
					if tc.sameTx { // committed, its record lost (a full volume)
						require.NoError(t, os.Remove(filepath.Join(s.root, dirTxns, txKey(txid)+".json")))
					}
				}
			}
			req := PublishRequest{TxID: txid, LeaseID: mine.ID, Changes: &ChangeSet{Changes: tc.mine}, Owner: sess1}
			if tc.pinned {
				req.ExpectVersion = 1
			}
			res, err := s.Publish(context.Background(), req)
			if tc.sameTx {
				require.NoError(t, err)
				require.True(t, res.Replayed, "answered by the commit of its txid")
				m, err := s.Manifest()
				require.NoError(t, err)
				require.Len(t, m.Layers, 2, "committed once")
				require.Zero(t, s.rebased.Load())
				return
			}
			if tc.pinned {
				var moved *HeadMovedError
				require.ErrorAs(t, err, &moved)
				require.Zero(t, s.rebased.Load())
				return
			}
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				require.Zero(t, s.rebased.Load())
				return
			}
			require.NoError(t, err)
			require.Equal(t, int64(3), res.Revision.ManifestVersion, "on top of the other commit")
			require.Equal(t, "mine\n", headFile(t, s, "a/mine.txt"))
			meta, err := s.LayerMeta(res.LayerID)
			require.NoError(t, err)
			require.Equal(t, int64(2), meta.ParentVersion)
			require.True(t, strings.HasPrefix(res.LayerID, "L000003-"), res.LayerID)
			if tc.rebased {
				require.Equal(t, 1, builds, "the layer was built once")
				require.Equal(t, int64(1), s.rebased.Load())
				for _, ch := range tc.other {
					if ch.Kind == ChangeWrite {
						require.Equal(t, string(ch.Data), headFile(t, s, ch.Path))
					}
				}
			} else {
				require.Equal(t, 2, builds, "built again against the new head")
				require.Zero(t, s.rebased.Load())
			}
			requireHealthy(t, s)
			s = reopen(t, s) // the manifest on disk names the layer under its new version
			require.Equal(t, "mine\n", headFile(t, s, "a/mine.txt"))
			requireHealthy(t, s)
		})
	}
}

// TestPublishOnAMovedHeadSeesWhatItDropped: a change the plan dropped as
// already in the head (two sessions made the same edit) is still this
// publish's: when the head moves under its build and the move changes that
// path again, the publish is resolved again and reports the conflict,
// rather than committing its layer on the new head without it.
func TestPublishOnAMovedHeadSeesWhatItDropped(t *testing.T) {
	s := newTestStore(t, tree{"c.txt": "b\n"})
	mine, same := mustLease(t, s, sess1), mustLease(t, s, sess2)
	_, err := publishOn(t, s, same, sess2, writes("c.txt", "c\n")) // the same edit as mine, first
	require.NoError(t, err)
	later := mustLease(t, s, "workspace_session:s3") // on that head
	moved := false
	s.afterBuild = func() {
		if !moved {
			moved = true
			_, err := publishOn(t, s, later, "workspace_session:s3", writes("c.txt", "d\n"))
			require.NoError(t, err)
		}
	}
	_, err = publishOn(t, s, mine, sess1, writes("c.txt", "c\n", "mine.txt", "m\n"))
	require.ErrorIs(t, err, ErrConflict)
	require.Zero(t, s.rebased.Load())
	require.Equal(t, "d\n", headFile(t, s, "c.txt"))
	requireHealthy(t, s)
}
