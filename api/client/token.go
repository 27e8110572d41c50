package client

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
// random bytes as hex) when missing.
func EnsureToken(path string) (string, error) {
	t, err := ReadToken(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return t, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
	tmp, err := os.CreateTemp(filepath.Dir(path), ".gateway.token-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", err
	}
	if _, err := tmp.WriteString(tok + "\n"); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	// Link rather than rename so a concurrent creator's token wins intact.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return ReadToken(path)
		}
		return "", err
	}
	return tok, nil
}

// Resolve builds a client the way every front end finds its gateway: the
// endpoint from the flag, else SANDBOX_GATEWAY_SOCKET, else the default;
// the token from the flag, else SANDBOX_GATEWAY_AUTH_TOKEN, else the token
// file (a missing file means no token; an unsafe one is an error).
func Resolve(endpoint, token string) (*Client, error) {
	if endpoint == "" {
		endpoint = EndpointFromEnv()
	}
	if token == "" {
		token = os.Getenv("SANDBOX_GATEWAY_AUTH_TOKEN")
	}
	if token == "" {
		t, err := ReadToken(TokenPath())
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		token = t
	}
	return New(endpoint, token), nil
}
