package secretfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// LoadOrCreate returns what read makes of the secret file at path. When
// read reports it missing (an error matching fs.ErrNotExist), it creates
// it and returns the new secret; if another process created it meanwhile,
// it returns what read makes of that one.
func LoadOrCreate(path string, read func(path string) (string, error)) (string, error) {
	s, err := read(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return s, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	secret := hex.EncodeToString(b[:])
	if err := atomicfile.Create(path, []byte(secret+"\n"), 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return read(path) // another process won the race
		}
		return "", err
	}
	return secret, nil
}
