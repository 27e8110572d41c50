package worker

import (
	"flag"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
)

// Flags are the command-line settings every process that runs workers
// shares (sandbox-gateway and sandbox-worker).
type Flags struct {
	StateDir, Address, Namespace, Embedded, UI, HostQueue, DaemonBin, Seccomp string
	Reconcile, Verbose                                                        bool
	// AllowRoots are the directories workspaces are copied from and
	// exports written to (--allow-root, repeatable); none = the user's
	// home and the current directory.
	AllowRoots []string
}

// Register declares the flags on fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.StateDir, "state-dir", DefaultStateDir(), "state directory (secret, embedded Temporal data)")
	fs.StringVar(&f.Address, "temporal-address", "", "Temporal frontend host:port (default $TEMPORAL_ADDRESS, else an embedded dev server)")
	fs.StringVar(&f.Namespace, "namespace", "", "Temporal namespace (default $TEMPORAL_NAMESPACE or default)")
	fs.StringVar(&f.Embedded, "temporal-embedded-address", "", "embedded Temporal frontend address (default 127.0.0.1:7233)")
	fs.StringVar(&f.UI, "temporal-ui", "off", "embedded Temporal UI address, e.g. 127.0.0.1:8233 (default off; when on, behind a Host check and the login URL printed at start)")
	fs.StringVar(&f.HostQueue, "host-queue", "", "this host's activity task queue (default eos-host-<hostname>)")
	fs.StringVar(&f.DaemonBin, "daemon-binary", "", "static sandbox-daemon to copy into sandboxes")
	fs.StringVar(&f.Seccomp, "seccomp-profile", "", "sandbox seccomp profile (default: next to the daemon binary, or sandboxinit/runtime/seccomp.json)")
	fs.BoolVar(&f.Reconcile, "reconcile", true, "at start, stop and list the sandboxes of this deployment whose workflow is gone (orphans; nothing is ever deleted)")
	fs.BoolVar(&f.Verbose, "v", false, "debug logging")
	fs.Func("allow-root", "a host directory workspaces may be copied from and exports written to (repeatable; default: your home and the current directory)", func(v string) error {
		f.AllowRoots = append(f.AllowRoots, v)
		return nil
	})
}

// HostPaths is the host path policy the flags describe: the allowed roots
// (or the defaults), with the state dir and the given dirs protected.
func (f *Flags) HostPaths(protected ...string) (*hostpath.Policy, error) {
	roots := f.AllowRoots
	if len(roots) == 0 {
		roots = hostpath.DefaultRoots()
	}
	return hostpath.New(roots, append([]string{f.StateDir}, protected...)...)
}

// Logger is the process logger at the level the flags ask for.
func (f *Flags) Logger() *slog.Logger {
	level := slog.LevelInfo
	if f.Verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Secret loads (or creates) the deployment secret in the state dir.
func (f *Flags) Secret() ([]byte, error) {
	return LoadOrCreateSecret(filepath.Join(f.StateDir, "gateway.secret"))
}

// Options are the Start options the flags describe.
func (f *Flags) Options(secret []byte, acts *activities.Activities, log *slog.Logger) Options {
	return Options{StateDir: filepath.Join(f.StateDir, "temporal"), TemporalAddress: f.Address, Namespace: f.Namespace,
		EmbeddedAddress: f.Embedded, UIAddress: f.UI, HostQueue: f.HostQueue, Activities: acts, Secret: secret, Logger: log}
}
