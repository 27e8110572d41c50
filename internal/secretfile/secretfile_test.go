package secretfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var secretLine = regexp.MustCompile(`^[0-9a-f]{64}\n$`)

// strict reads a secret file the way a careful caller does: it must be
// owner-only and hold exactly one secret line, so a reader that catches
// the file empty or half written fails.
func strict(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.Mode().Perm() != 0o600 {
		return "", fmt.Errorf("%s has mode %04o", path, fi.Mode().Perm())
	}
	if !secretLine.Match(b) {
		return "", fmt.Errorf("%s holds %q", path, b)
	}
	return string(b[:64]), nil
}

func TestLoadOrCreate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "gateway.secret")
	s, err := LoadOrCreate(path, strict)
	require.NoError(t, err)
	require.Len(t, s, 64)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, s+"\n", string(b), "64 hex characters and a newline")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())
	fi, err = os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o700), fi.Mode().Perm())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "no temp file is left")

	again, err := LoadOrCreate(path, strict)
	require.NoError(t, err)
	require.Equal(t, s, again, "an existing secret is read, never replaced")

	other, err := LoadOrCreate(filepath.Join(dir, "other.secret"), strict)
	require.NoError(t, err)
	require.NotEqual(t, s, other, "every secret is random")
}

func TestLoadOrCreateReadErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.token")
	require.NoError(t, os.WriteFile(path, []byte("short\n"), 0o644))
	require.NoError(t, os.Chmod(path, 0o644)) // whatever the umask
	_, err := LoadOrCreate(path, strict)
	require.ErrorContains(t, err, "has mode 0644", "the reader's error is returned")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "short\n", string(b), "a file the reader refuses is left alone")

	refused := errors.New("refused")
	missing := filepath.Join(dir, "missing")
	_, err = LoadOrCreate(missing, func(string) (string, error) { return "", refused })
	require.ErrorIs(t, err, refused)
	_, err = os.Stat(missing)
	require.ErrorIs(t, err, fs.ErrNotExist, "only a missing file is created")
}

// TestLoadOrCreateRace: gateways and workers of one deployment starting
// at once agree on one secret, and none of them reads the file before it
// is whole.
func TestLoadOrCreateRace(t *testing.T) {
	for round := 0; round < 50; round++ {
		path := filepath.Join(t.TempDir(), "gateway.secret")
		const n = 8
		got := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { got[i], errs[i] = LoadOrCreate(path, strict) })
		}
		wg.Wait()
		for i := 0; i < n; i++ {
			require.NoError(t, errs[i], "round %d, process %d", round, i)
			require.Equal(t, got[0], got[i], "round %d: process %d has another secret", round, i)
		}
	}
}
