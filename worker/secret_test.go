package worker

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadOrCreateSecret(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state", "gateway.secret")
	s, err := LoadOrCreateSecret(path)
	require.NoError(t, err)
	require.Len(t, s, 64, "32 random bytes as hex")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(s)+"\n", string(b))
	again, err := LoadOrCreateSecret(path)
	require.NoError(t, err)
	require.Equal(t, s, again)

	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		err           string
	}{
		{"group readable", string(s) + "\n", 0o640, "has mode 0640: it must be readable by its owner only (chmod 600)"},
		{"too short", "0123456789abcdef\n", 0o600, "holds fewer than 32 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			require.NoError(t, os.WriteFile(p, []byte(tc.content), 0o600))
			require.NoError(t, os.Chmod(p, tc.mode))
			_, err := LoadOrCreateSecret(p)
			require.ErrorContains(t, err, tc.err)
		})
	}
}

// A --daemon-binary that names no file, or a file no sandbox container can
// run, stops the worker process at start with the reason; another build is
// never picked in its place.
func TestBuildActivitiesRefusesADaemonItCannotUse(t *testing.T) {
	dir := t.TempDir()
	seccomp := filepath.Join(dir, "seccomp.json")
	require.NoError(t, os.WriteFile(seccomp, []byte(`{"defaultAction":"SCMP_ACT_ERRNO"}`), 0o644))

	_, err := BuildActivities([]byte("secret"), filepath.Join(dir, "missing"), seccomp, nil, nil)
	require.ErrorContains(t, err, "--daemon-binary "+filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)

	script := filepath.Join(dir, "sandbox-daemon")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nexec true\n"), 0o755))
	_, err = BuildActivities([]byte("secret"), script, seccomp, nil, nil)
	require.ErrorContains(t, err, script+" is not an ELF executable")
	require.ErrorContains(t, err, "make binaries")
}
