package worker

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/internal/secretfile"
)

// DefaultStateDir is ~/.ephemeral-sandbox.
func DefaultStateDir() string {
	if d := os.Getenv("EOS_STATE_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ".ephemeral-sandbox"
	}
	return filepath.Join(home, ".ephemeral-sandbox")
}

// LoadOrCreateSecret reads a 0600 file of 32 random bytes (hex), creating
// it when missing. Gateways and workers of one deployment share it: every
// sandbox's daemon token is derived from it.
func LoadOrCreateSecret(path string) ([]byte, error) {
	s, err := secretfile.LoadOrCreate(path, readSecret)
	if err != nil {
		return nil, err
	}
	return []byte(s), nil
}

func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s has mode %04o: it must be readable by its owner only (chmod 600)", path, fi.Mode().Perm())
	}
	s := strings.TrimSpace(string(b))
	if len(s) < 32 {
		return "", fmt.Errorf("%s holds fewer than 32 characters", path)
	}
	return s, nil
}

// FindDaemonBinary locates the static sandbox-daemon: the given path, next
// to this executable, or bin/ of the working directory.
func FindDaemonBinary(given string) (string, error) {
	if given != "" {
		// A path asked for is that file or an error, never another build.
		fi, err := os.Stat(given)
		if err != nil {
			return "", fmt.Errorf("--daemon-binary %s: %w", given, err)
		}
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("--daemon-binary %s is not a regular file", given)
		}
		return filepath.Abs(given)
	}
	var cands []string
	if exe, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(exe), "sandbox-daemon"))
	}
	cands = append(cands, filepath.Join("bin", "sandbox-daemon"), "/usr/local/lib/eos/sandbox-daemon")
	for _, c := range cands {
		if c == "" {
			continue
		}
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			return filepath.Abs(c)
		}
	}
	return "", fmt.Errorf("sandbox-daemon binary not found (looked at %s): build it with `make daemon` or pass --daemon-binary", strings.Join(cands, ", "))
}

// BuildActivities assembles the activities of a worker process: the static
// daemon binary (FindDaemonBinary), the sandbox seccomp profile (the given
// path, else seccomp.json beside the daemon binary or in the source tree),
// the Docker client, the gateway secret every daemon token derives from,
// and the host path policy (nil = hostpath.Default()).
func BuildActivities(secret []byte, daemonBin, seccomp string, hostPaths *hostpath.Policy, log *slog.Logger) (*activities.Activities, error) {
	bin, err := FindDaemonBinary(daemonBin)
	if err != nil {
		return nil, err
	}
	if seccomp == "" {
		for _, c := range []string{filepath.Join(filepath.Dir(bin), "seccomp.json"), "sandboxinit/runtime/seccomp.json", "/usr/local/lib/eos/seccomp.json"} {
			if _, err := os.Stat(c); err == nil {
				seccomp = c
				break
			}
		}
	}
	profile, err := os.ReadFile(seccomp)
	if err != nil {
		return nil, fmt.Errorf("sandbox seccomp profile: %w (pass --seccomp-profile)", err)
	}
	dc, err := activities.NewDockerClient()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	acts := activities.New(activities.Config{DaemonBinary: bin, SeccompProfile: string(profile), Secret: secret, WorkerID: host, HostPaths: hostPaths, Logger: log}, dc)
	if err := acts.CheckDaemonFiles(); err != nil {
		return nil, err
	}
	return acts, nil
}
