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

// built builds something once per test binary into a fresh temp dir.
type built struct {
	once sync.Once
	dir  string
	err  error
}

// get runs build(dir) the first time and fails t with its error every time.
func (b *built) get(t testing.TB, prefix string, build func(dir string) error) string {
	t.Helper()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", prefix); b.err == nil {
			b.err = build(b.dir)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

// goBuild runs go build in the module root.
func goBuild(env []string, args ...string) error {
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}

var daemonBuild built

// DaemonBinary builds cmd/sandbox-daemon the way the product ships it: one
// statically linked binary with libseccomp inside, and the session init
// (cmd/sandbox-sessinit) next to it.
func DaemonBinary(t testing.TB) string {
	t.Helper()
	dir := daemonBuild.get(t, "eos-daemon-bin-", func(dir string) error {
		err := goBuild([]string{"CGO_ENABLED=1"}, "-tags", "seccomp osusergo netgo", "-ldflags", "-linkmode external -extldflags -static",
			"-o", filepath.Join(dir, "sandbox-daemon"), "./cmd/sandbox-daemon")
		if err != nil {
			return fmt.Errorf("static build of sandbox-daemon (needs libseccomp-dev: scripts/ensure-build-deps.sh): %w", err)
		}
		// Next to the daemon, as make daemon leaves it: sandboxes then
		// run each session's init from it.
		return BuildSessinit(filepath.Join(dir, "sandbox-sessinit"))
	})
	return filepath.Join(dir, "sandbox-daemon")
}

// BuildSessinit builds the session init (cmd/sandbox-sessinit, static C)
// at out, as make daemon does.
func BuildSessinit(out string) error {
	cmd := exec.Command("bash", filepath.Join(RepoRoot(), "scripts", "build-sessinit.sh"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the session init (needs a C compiler and a static libc: scripts/ensure-build-deps.sh): %v\n%s", err, b)
	}
	return nil
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
