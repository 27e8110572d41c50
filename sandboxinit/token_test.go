package sandboxinit

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// What the daemon checks a token against: the token file when it exists
// (an adopted container's rotated token), else --token-sha256 (a new
// container's argument). A bad digest, or a token file anyone may read, is
// an error at start, never an open door.
func TestTokenSum(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "daemon.token")
	digest := func(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }

	sum, err := tokenSum(file, digest(testToken))
	require.NoError(t, err, "no file: the digest")
	require.Equal(t, sha256.Sum256([]byte(testToken)), sum)
	up, err := tokenSum(file, strings.ToUpper(digest(testToken)))
	require.NoError(t, err, "hex of either case")
	require.Equal(t, sum, up)

	for _, bad := range []string{"abc", digest(testToken)[:63], digest(testToken) + "00", strings.Repeat("g", 64), testToken} {
		_, err := tokenSum(file, bad)
		require.ErrorContains(t, err, "--token-sha256", "digest %q", bad)
	}
	_, err = tokenSum(file, "")
	require.ErrorContains(t, err, "daemon token", "neither file nor digest")

	require.NoError(t, os.WriteFile(file, []byte("rotated-token-of-a-new-deployment\n"), 0o600))
	sum, err = tokenSum(file, digest(testToken))
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256([]byte("rotated-token-of-a-new-deployment")), sum, "the file wins over the argument")

	require.NoError(t, os.Chmod(file, 0o644))
	_, err = tokenSum(file, digest(testToken))
	require.ErrorContains(t, err, "0600", "a readable token file is refused, not skipped for the digest")
}

// Over HTTP: the token opens the daemon; its digest, which is in the
// container's argv for anyone to read, does not.
func TestDigestIsNotAToken(t *testing.T) {
	d := newBarrenDaemon(t)
	var err error
	s := sha256.Sum256([]byte(testToken))
	d.tokenSum, err = tokenSum(filepath.Join(t.TempDir(), "none"), hex.EncodeToString(s[:]))
	require.NoError(t, err)
	h := NewServer(d).http.Handler

	code, out := postImport(t, h, hex.EncodeToString(s[:]), "", tarFiles(t, "a.txt", "a"))
	require.Equal(t, http.StatusUnauthorized, code, out)
	code, out = postImport(t, h, testToken, "", tarFiles(t, "a.txt", "a"))
	require.Equal(t, http.StatusOK, code, out)
}
