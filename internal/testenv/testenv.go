package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Images the end-to-end tests use (scripts/build-test-images.sh).
var Images = []string{"eos-test-busybox:1", "eos-test-debian:1"}

// RequireDocker fails the test (never skips) with how to get Docker.
func RequireDocker(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatalf("docker CLI not found: these tests need a Docker Engine (run scripts/ensure-docker.sh)")
	}
	if out, err := exec.Command("docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		t.Fatalf("Docker Engine not reachable (run scripts/ensure-docker.sh): %v: %s", err, out)
	}
	for _, img := range Images {
		if out, err := exec.Command("docker", "image", "inspect", img).CombinedOutput(); err != nil {
			t.Fatalf("image %s missing (run scripts/build-test-images.sh): %v: %.300s", img, err, out)
		}
	}
}

// RepoRoot is the module root.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

var (
	once   sync.Once
	bin    string
	binErr error
)

// DaemonBinary builds cmd/sandbox-daemon the way the product ships it: one
// statically linked binary with libseccomp inside.
func DaemonBinary(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		dir, err := os.MkdirTemp("", "eos-daemon-bin-")
		if err != nil {
			binErr = err
			return
		}
		bin = filepath.Join(dir, "sandbox-daemon")
		cmd := exec.Command("go", "build", "-tags", "seccomp osusergo netgo", "-ldflags", "-linkmode external -extldflags -static",
			"-o", bin, "./cmd/sandbox-daemon")
		cmd.Dir = RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("static build of sandbox-daemon (needs libseccomp-dev: scripts/ensure-build-deps.sh): %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return bin
}

// SeccompProfile returns the sandbox seccomp profile's JSON.
func SeccompProfile(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "sandboxinit", "runtime", "seccomp.json"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
