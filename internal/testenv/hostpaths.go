package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/hostpath"
)

// TempRoot is the resolved temp dir every t.TempDir lives under: the one
// allowed root (--allow-root) of the tests' gateways and activities.
func TempRoot(t testing.TB) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// HostPaths is the tests' host path policy: TempRoot is the one allowed
// root, and the given dirs are protected.
func HostPaths(t testing.TB, protected ...string) *hostpath.Policy {
	t.Helper()
	p, err := hostpath.New([]string{TempRoot(t)}, protected...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
