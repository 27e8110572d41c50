package runtime

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestWriteEtcNeverWritesThroughALink: the session's root overlay is its
// own, so a /etc (or a file in it) that it made a symlink never leads
// writeEtc outside; its own files in the upper dir are kept.
func TestWriteEtcNeverWritesThroughALink(t *testing.T) {
	setup := func(t *testing.T) (rootDirs, string) {
		base := t.TempDir()
		d := rootDirs{upper: filepath.Join(base, "upper"), work: filepath.Join(base, "work"), merged: filepath.Join(base, "merged")}
		outside := filepath.Join(base, "outside")
		for _, p := range []string{d.upper, d.merged, outside} {
			require.NoError(t, os.MkdirAll(p, 0o755))
		}
		require.NoError(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("outside\n"), 0o644))
		return d, outside
	}
	requireUntouched := func(t *testing.T, outside string) {
		ents, err := os.ReadDir(outside)
		require.NoError(t, err)
		require.Len(t, ents, 1, "nothing written outside")
		b, err := os.ReadFile(filepath.Join(outside, "keep"))
		require.NoError(t, err)
		require.Equal(t, "outside\n", string(b))
	}

	t.Run("plain", func(t *testing.T) {
		d, outside := setup(t)
		require.NoError(t, os.MkdirAll(filepath.Join(d.merged, "etc"), 0o755))
		require.NoError(t, os.Symlink(filepath.Join(outside, "keep"), filepath.Join(d.merged, "etc", "resolv.conf")))
		require.NoError(t, writeEtc(d, "ws-1", "", sessionResolvConf(false, Egress{}, "")))
		b, err := os.ReadFile(filepath.Join(d.merged, "etc", "hostname"))
		require.NoError(t, err)
		require.Equal(t, "ws-1\n", string(b))
		fi, err := os.Lstat(filepath.Join(d.merged, "etc", "resolv.conf"))
		require.NoError(t, err)
		require.True(t, fi.Mode().IsRegular(), "the symlink is replaced, not written through")
		requireUntouched(t, outside)
	})
	t.Run("etc is a symlink", func(t *testing.T) {
		d, outside := setup(t)
		require.NoError(t, os.Symlink(outside, filepath.Join(d.merged, "etc")))
		require.NoError(t, writeEtc(d, "ws-1", "", sessionResolvConf(false, Egress{}, "")))
		requireUntouched(t, outside)
	})
	t.Run("the upper's etc is a symlink", func(t *testing.T) {
		d, outside := setup(t)
		require.NoError(t, os.Symlink(outside, filepath.Join(d.upper, "etc")))
		require.NoError(t, os.Symlink(outside, filepath.Join(d.merged, "etc")))
		require.NoError(t, writeEtc(d, "ws-1", "", sessionResolvConf(false, Egress{}, "")))
		requireUntouched(t, outside)
	})
	t.Run("the session's own files stay", func(t *testing.T) {
		d, outside := setup(t)
		require.NoError(t, os.MkdirAll(filepath.Join(d.upper, "etc"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d.upper, "etc", "hostname"), []byte("mine\n"), 0o644))
		require.NoError(t, os.MkdirAll(filepath.Join(d.merged, "etc"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d.merged, "etc", "hostname"), []byte("mine\n"), 0o644))
		require.NoError(t, os.Symlink(filepath.Join(outside, "keep"), filepath.Join(d.merged, "etc", "hosts")))
		require.NoError(t, writeEtc(d, "ws-1", "10.1.0.2", sessionResolvConf(false, Egress{}, "")))
		b, _ := os.ReadFile(filepath.Join(d.merged, "etc", "hostname"))
		require.Equal(t, "mine\n", string(b))
		b, _ = os.ReadFile(filepath.Join(d.merged, "etc", "hosts"))
		require.Contains(t, string(b), "10.1.0.2\tws-1\n")
		requireUntouched(t, outside)
	})
}

// TestPreflightNamesAKernelWithoutOpenat2: a kernel older than 5.6 is
// named at start, not met as ENOSYS in a session's first file operation.
func TestPreflightNamesAKernelWithoutOpenat2(t *testing.T) {
	require.NoError(t, checkOpenat2(), "this kernel has openat2")
	defer func(f func(int, string, *unix.OpenHow) (int, error)) { openat2 = f }(openat2)
	openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, unix.ENOSYS }
	err := checkOpenat2()
	require.ErrorIs(t, err, ErrUnsupported)
	require.ErrorContains(t, err, "no openat2")
	require.ErrorContains(t, err, "Linux 5.6 or later")
}
