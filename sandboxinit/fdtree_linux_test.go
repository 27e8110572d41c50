package sandboxinit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func openDirFd(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestCopyTreeAtNeverFollowsSymlinks: the copy fallback of file_move copies
// files, directories and symlinks (as symlinks), never what a symlink
// points to, and refuses special files.
func TestCopyTreeAtNeverFollowsSymlinks(t *testing.T) {
	src, dst, outside := t.TempDir(), t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	tree := filepath.Join(src, "t")
	require.NoError(t, os.MkdirAll(filepath.Join(tree, "sub"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(tree, "sub", "f.txt"), []byte("f"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(tree, "sub", "f.txt"), 0o755)) // whatever the umask
	require.NoError(t, os.Symlink(outside, filepath.Join(tree, "outlink")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(tree, "sub", "secretlink")))

	require.NoError(t, copyTreeAt(openDirFd(t, src), "t", openDirFd(t, dst), "copy"))
	b, err := os.ReadFile(filepath.Join(dst, "copy", "sub", "f.txt"))
	require.NoError(t, err)
	require.Equal(t, "f", string(b))
	fi, err := os.Stat(filepath.Join(dst, "copy", "sub", "f.txt"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
	for _, l := range []string{"outlink", "sub/secretlink"} {
		fi, err := os.Lstat(filepath.Join(dst, "copy", l))
		require.NoError(t, err)
		require.True(t, fi.Mode()&os.ModeSymlink != 0, "%s copied as a symlink", l)
	}
	require.NoError(t, unix.Mkfifo(filepath.Join(tree, "pipe"), 0o644))
	err = copyTreeAt(openDirFd(t, src), "t", openDirFd(t, dst), "copy2")
	require.ErrorIs(t, err, layerstack.ErrNotRegular)
}

// TestWalkAtNeverEntersSymlinks: file_search's walk reports a symlink to a
// directory as an entry and never lists what is behind it.
func TestWalkAtNeverEntersSymlinks(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("s"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "a", "b", "c.txt"), []byte("c"), 0o644))
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "a", "out")))
	require.NoError(t, os.Symlink("b", filepath.Join(root, "a", "in")))
	f, err := os.Open(root)
	require.NoError(t, err)
	defer f.Close()
	var seen []string
	require.NoError(t, walkAt(f, "", func(rel string, st *unix.Stat_t) error {
		seen = append(seen, rel)
		return nil
	}))
	require.Equal(t, []string{"a", "a/b", "a/b/c.txt", "a/in", "a/out"}, seen)
}
