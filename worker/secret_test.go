package worker

import (
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
