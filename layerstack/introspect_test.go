package layerstack

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestIntrospection(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "hello\n", "dir/b.txt": strings.Repeat("b", 10000), "gone.txt": "x", "d2/keep": "k"})
	lease := mustLease(t, s, "workspace_session:ws-1")
	cs := writes("new.txt", "12345")
	cs.Changes = append(cs.Changes, Change{Path: "gone.txt", Kind: ChangeDelete}, Change{Path: "ln", Kind: ChangeSymlink, Target: "a.txt"},
		Change{Path: "d2", Kind: ChangeOpaque, Mode: 0o755})
	_, err := publishOn(t, s, lease, "workspace_session:ws-1", cs)
	require.NoError(t, err)
	m, err := s.Manifest()
	require.NoError(t, err)
	require.Len(t, m.Layers, 2)

	base, err := s.LayerUsage(m.Base())
	require.NoError(t, err)
	require.Equal(t, int64(6+10000+1+1), base.Bytes, "logical = sum of file sizes")
	require.GreaterOrEqual(t, base.AllocatedBytes, int64(10000), "allocated counts blocks")
	again, err := s.LayerUsage(m.Base())
	require.NoError(t, err)
	require.Equal(t, base, again)

	ents, more, err := s.LayerEntries(m.Head(), 500)
	require.NoError(t, err)
	require.False(t, more)
	kinds := map[string]string{}
	for _, e := range ents {
		kinds[e.Path] = e.Kind
	}
	require.Equal(t, map[string]string{"new.txt": EntryFile, "gone.txt": EntryDelete, "ln": EntrySymlink, "d2": EntryOpaqueDir}, kinds)
	ents, more, err = s.LayerEntries(m.Base(), 2)
	require.NoError(t, err)
	require.True(t, more)
	require.Equal(t, []LayerEntry{{"a.txt", EntryFile}, {"d2", EntryDirectory}}, ents, "lexical order, depth first")

	st, err := s.StorageUsage()
	require.NoError(t, err)
	require.Equal(t, 2, st.Layers)
	require.Greater(t, st.LogicalBytes, base.Bytes)
	s.tidy.Wait() // a committed publish's staging goes beside its answer
	n, err := s.StagingEntries()
	require.NoError(t, err)
	require.Zero(t, n)
	l, ok := s.FindLayer(m.Head().ID)
	require.True(t, ok)
	require.Equal(t, m.Head(), l)
	_, ok = s.FindLayer("L-nope")
	require.False(t, ok)
}

// After a squash the squashed layer hardlinks its sources: while a lease
// keeps them on disk, storage counts each inode once.
func TestStorageUsageCountsHardlinksOnce(t *testing.T) {
	s := newTestStore(t, tree{"base.txt": "b\n"})
	for i := 0; i < 4; i++ {
		l := mustLease(t, s, "workspace_session:ws")
		_, err := publishOn(t, s, l, "workspace_session:ws", writes(strings.Repeat("x", i+1)+".bin", strings.Repeat("z", 64<<10)))
		require.NoError(t, err)
		require.NoError(t, s.Release(l.ID))
	}
	hold := mustLease(t, s, "workspace_session:holder") // keeps the pre-squash layers on disk
	before, err := s.StorageUsage()
	require.NoError(t, err)
	res, err := s.Squash(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, res.SquashedBlocks)
	after, err := s.StorageUsage()
	require.NoError(t, err)
	require.Greater(t, after.Layers, before.Layers, "the squashed layer joins its leased sources")
	require.Greater(t, after.LogicalBytes, before.LogicalBytes+3*64<<10, "logical bytes count every layer's files")
	require.Less(t, after.AllocatedBytes, before.AllocatedBytes+64<<10, "hardlinked data is allocated once")
	_ = hold
}
