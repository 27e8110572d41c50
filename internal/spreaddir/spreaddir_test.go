package spreaddir

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestSpreadSetsTheFlagOnExt4(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	before := flagsOf(t, dir)
	ok, err := Spread(dir)
	if st.Type != ext4SuperMagic {
		require.NoError(t, err)
		require.False(t, ok, "a file system without the flag is left alone")
		t.Logf("TMPDIR %s is not on ext4 (magic %#x): the no-op is what there is to check", dir, st.Type)
		return
	}
	require.NoError(t, err)
	require.True(t, ok)
	has, err := Spreads(dir)
	require.NoError(t, err)
	require.True(t, has)
	require.Equal(t, before|topdirFL, flagsOf(t, dir), "the directory's other flags are kept")
	again, err := Spread(dir) // idempotent
	require.NoError(t, err)
	require.True(t, again)

	// The flag is the parent's only: a subdirectory does not inherit it.
	sub := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	has, err = Spreads(sub)
	require.NoError(t, err)
	require.False(t, has)
}

func TestSpreadRefusesWhatIsNotADirectory(t *testing.T) {
	dir := t.TempDir()
	ext4, err := Supported(dir)
	require.NoError(t, err)
	f := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(f, nil, 0o644))
	link := filepath.Join(dir, "l")
	require.NoError(t, os.Symlink(dir, link))
	for _, p := range []string{f, link} { // never a file, never through a symlink
		ok, err := Spread(p)
		require.False(t, ok, p)
		if ext4 {
			require.Error(t, err, p)
		} else {
			require.NoError(t, err, "%s: another file system is left alone", p)
		}
		_, err = Spreads(p) // reading opens it the same way, on any file system
		require.Error(t, err, p)
	}
	_, err = Spread(filepath.Join(dir, "missing"))
	require.Error(t, err)
}

func flagsOf(t *testing.T, dir string) uint32 {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	require.NoError(t, err)
	return flags
}
