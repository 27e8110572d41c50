package activities

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func prefetchTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "src", "deep"), 0o755))
	for i, n := range []int{0, 1, 511, 512, 513, 70_000, 300_000} {
		b := bytes.Repeat([]byte{byte('a' + i)}, n)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "src", "deep", "f"+string(rune('a'+i))), b, 0o644))
	}
	require.NoError(t, os.Symlink("src/deep/fa", filepath.Join(dir, "link")))
	return dir
}

// A prefetch is the very tar the import would have streamed, whether the
// tree fits in its buffer or goes past it.
func TestPrefetchIsTheTarTheImportWouldRead(t *testing.T) {
	root := prefetchTree(t)
	var want bytes.Buffer
	require.NoError(t, (&workspaceTar{ctx: context.Background(), root: root}).stream(&want))
	defer func(m int) { prefetchMax = m }(prefetchMax)
	for _, max := range []int{1 << 30, 100_000, 1} {
		prefetchMax = max
		a := &Activities{}
		a.startPrefetch("sbx1", root)
		time.Sleep(20 * time.Millisecond) // let it pack what it holds
		p := a.takePrefetch("sbx1", root, nil)
		require.NotNil(t, p)
		got, err := io.ReadAll(p.pr)
		require.NoError(t, err)
		require.NoError(t, <-p.werr)
		require.True(t, bytes.Equal(want.Bytes(), got), "max %d: %d bytes, want %d", max, len(got), want.Len())
		require.Equal(t, 7, p.w.report().Files)
		require.Nil(t, a.takePrefetch("sbx1", root, nil), "taken once")
	}
}

// Only an import of the same root takes it; one nobody takes is dropped
// after prefetchTTL, and a second create's replaces the first's: the
// writer ends each time, nothing stays behind.
func TestPrefetchTakenDroppedReplaced(t *testing.T) {
	root, other := prefetchTree(t), prefetchTree(t)
	a := &Activities{}
	peek := func(id string) *prefetch { a.pf.mu.Lock(); defer a.pf.mu.Unlock(); return a.pf.m[id] }
	a.startPrefetch("sbx1", root)
	require.Nil(t, a.takePrefetch("sbx1", other, nil), "another root")
	require.Nil(t, a.takePrefetch("sbx2", root, nil), "another sandbox")
	first := peek("sbx1")
	a.startPrefetch("sbx1", root)
	require.ErrorIs(t, <-first.werr, errPrefetchDropped, "replaced")

	ttl := prefetchTTL
	defer func() { prefetchTTL = ttl }()
	prefetchTTL = 30 * time.Millisecond
	p := a.startPrefetch("sbx3", root) // peek could come after the drop
	require.NotNil(t, p)
	select {
	case err := <-p.werr:
		require.ErrorIs(t, err, errPrefetchDropped)
	case <-time.After(10 * time.Second):
		t.Fatal("an untaken prefetch was not dropped")
	}
	require.Nil(t, a.takePrefetch("sbx3", root, nil))

	// A taken one outlives the TTL: the import reads it at its pace.
	// (A stall of the TTL between start and take lets the drop win: start
	// again then.)
	p = nil
	for i := 0; p == nil; i++ {
		require.Less(t, i, 100, "no sbx4 prefetch to take")
		require.NotNil(t, a.startPrefetch("sbx4", root), "a slot is free")
		p = a.takePrefetch("sbx4", root, nil)
	}
	time.Sleep(100 * time.Millisecond)
	_, err := io.ReadAll(p.pr)
	require.NoError(t, err)
	require.NoError(t, <-p.werr)
}

// A burst of creates holds at most prefetchSlots prefetches; the rest get
// none (their imports read the tree) until one is taken.
func TestPrefetchSlotsBoundTheMemory(t *testing.T) {
	root := prefetchTree(t)
	defer func(n int) { prefetchSlots = n }(prefetchSlots)
	prefetchSlots = 2
	a := &Activities{}
	for _, id := range []string{"s1", "s2", "s3"} {
		a.startPrefetch(id, root)
	}
	require.Nil(t, a.takePrefetch("s3", root, nil), "past the slots")
	p := a.takePrefetch("s1", root, nil)
	require.NotNil(t, p)
	a.startPrefetch("s3", root)
	p3 := a.takePrefetch("s3", root, nil)
	require.NotNil(t, p3, "a slot freed by the take")
	for _, q := range []*prefetch{p, a.takePrefetch("s2", root, nil), p3} {
		_, err := io.ReadAll(q.pr)
		require.NoError(t, err)
		require.NoError(t, <-q.werr)
	}
}

// CreateContainer packs the workspace when asked, keeps it for the import
// when it succeeds, and drops it when it fails (no import follows).
func TestCreateContainerPrefetches(t *testing.T) {
	root := prefetchTree(t)
	acts := newTestActivities(t, newFakeDocker())
	resolved, err := acts.cfg.HostPaths.Workspace("workspace_root", root)
	require.NoError(t, err)
	spec := testSpec("sbx1")
	spec.WorkspaceRoot, spec.PrefetchWorkspace = root, true
	_, err = acts.CreateContainer(context.Background(), spec)
	require.NoError(t, err)
	p := acts.takePrefetch("sbx1", resolved, nil)
	require.NotNil(t, p, "kept for the import")
	p.pr.Close()
	require.Error(t, <-p.werr)

	spec = testSpec("sbx2")
	spec.WorkspaceRoot, spec.PrefetchWorkspace, spec.Image = root, true, "missing:1"
	_, err = acts.CreateContainer(context.Background(), spec)
	require.Error(t, err)
	require.Nil(t, acts.takePrefetch("sbx2", resolved, nil), "dropped with the failed create")

	spec = testSpec("sbx3")
	spec.WorkspaceRoot = root
	_, err = acts.CreateContainer(context.Background(), spec)
	require.NoError(t, err)
	require.Nil(t, acts.takePrefetch("sbx3", resolved, nil), "not asked: none")
}
