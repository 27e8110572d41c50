package layerstack

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/spreaddir"
)

// On ext4 the directories the store builds in, and an import's root, have
// their subdirectories spread over the file system's groups (spreaddir's
// doc: without it, on ext4 without a journal, every create scanned the
// inodes the last minutes freed).
func TestStoreSpreadsTheDirectoriesItBuildsIn(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root, Options{})
	require.NoError(t, err, "a store opens whether or not its file system can spread")
	t.Cleanup(func() { s.Close() })
	if ok, err := spreaddir.Supported(root); err != nil || !ok {
		// Nothing to spread there: the store opened and imports as usual.
		src := t.TempDir()
		writeTree(t, src, tree{"a.txt": "a"})
		_, _, err := ImportDir(context.Background(), src, filepath.Join(s.Root(), dirBase), ImportOptions{})
		require.NoError(t, err)
		t.Logf("TMPDIR %s is not on ext4: checked that the store works without the flag", root)
		return
	}
	for _, d := range []string{dirStaging, dirBase} {
		spread, err := spreaddir.Spreads(filepath.Join(s.Root(), d))
		require.NoError(t, err)
		require.True(t, spread, d)
	}
	has, err := spreaddir.Spreads(filepath.Join(s.Root(), dirLayers))
	require.NoError(t, err)
	require.False(t, has, "layers are renamed in, never made there")

	src := t.TempDir()
	writeTree(t, src, tree{"a.txt": "a", "sub/b.txt": "b"})
	info, _, err := ImportDir(context.Background(), src, filepath.Join(s.Root(), dirBase), ImportOptions{})
	require.NoError(t, err)
	has, err = spreaddir.Spreads(info.Path)
	require.NoError(t, err)
	require.True(t, has, "an import's root spreads the tree's directories")
	has, err = spreaddir.Spreads(filepath.Join(info.Path, "sub"))
	require.NoError(t, err)
	require.False(t, has)
}
