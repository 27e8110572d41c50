package client

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/internal/secretfile"
)

// TokenPath is $SANDBOX_GATEWAY_TOKEN_FILE or ~/.ephemeral-sandbox/gateway.token.
func TokenPath() string {
	if p := os.Getenv("SANDBOX_GATEWAY_TOKEN_FILE"); p != "" {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "."
	}
	return filepath.Join(home, ".ephemeral-sandbox", "gateway.token")
}

// ReadToken reads a token file: exactly one non-empty line, not readable by
// group or other.
func ReadToken(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s is accessible by group or other (mode %v); chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\r\n"), "\n")
	if len(lines) != 1 || strings.TrimSpace(lines[0]) == "" {
		return "", fmt.Errorf("token file %s must hold exactly one non-empty line", path)
	}
	return strings.TrimSpace(lines[0]), nil
}

// EnsureToken reads the token file, creating it (dir 0700, file 0600, 32
// random bytes as hex) when missing; a concurrent creator's token wins
// intact.
func EnsureToken(path string) (string, error) {
	return secretfile.LoadOrCreate(path, ReadToken)
}
