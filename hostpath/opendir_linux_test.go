package hostpath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// OpenDir opens or makes a directory with no symlink anywhere in its path
// at the moment it is opened; what it refuses it does not make.
func TestOpenDirRefusesSymlinksAsItGoes(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	victim := t.TempDir()
	require.NoError(t, os.Symlink(victim, filepath.Join(root, "link")))
	require.NoError(t, os.WriteFile(filepath.Join(root, "file"), nil, 0o644))

	f, err := OpenDir("dest", filepath.Join(root, "a/b/c"), true)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.DirExists(t, filepath.Join(root, "a/b/c"))

	_, err = OpenDir("dest", filepath.Join(root, "missing"), false)
	require.True(t, errors.Is(err, fs.ErrNotExist), "%v", err)
	require.NoDirExists(t, filepath.Join(root, "missing"))

	for _, tc := range []struct{ path, rule string }{
		{"link", RuleSymlink}, {"link/new", RuleSymlink}, {"file", RuleKind}, {"file/new", RuleKind},
	} {
		_, err := OpenDir("dest", filepath.Join(root, tc.path), true)
		var he *Error
		require.True(t, errors.As(err, &he), "%s: %v", tc.path, err)
		require.Equal(t, tc.rule, he.Rule, "%s: %v", tc.path, err)
	}
	left, err := os.ReadDir(victim)
	require.NoError(t, err)
	require.Empty(t, left, "nothing made through the symlink")
	_, err = OpenDir("dest", "relative/path", true)
	require.Error(t, err)
}
