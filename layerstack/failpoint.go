package layerstack

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// FailpointEnv names the environment variable that arms failpoints: a comma
// separated list of failpoint names. An armed failpoint SIGKILLs the process
// when reached, which is how the crash tests stop a commit at each step.
const FailpointEnv = "LAYERSTACK_FAILPOINTS"

// Failpoints on the commit path, in the order a commit reaches them.
const (
	FailAfterStaging  = "after-staging"  // layer written and synced in staging/
	FailAfterRename   = "after-rename"   // layer renamed into layers/
	FailAfterMeta     = "after-meta"     // metadata written
	FailAfterSync     = "after-sync"     // layer, metadata and next manifest durable
	FailAfterManifest = "after-manifest" // manifest replaced: the commit point
	FailAfterAudit    = "after-audit"    // audit line appended
	FailAfterTx       = "after-tx"       // transaction record written
	FailSquashCommit  = "squash-before-manifest"
	// A fork: its upper dir written, then its lease persisted (the
	// caller has not recorded the new session yet).
	FailForkAfterUpper = "fork-after-upper"
	FailForkAfterLease = "fork-after-lease"
	// A destroy (the daemon's, sandboxinit): answered, the session's
	// processes killed, its record marked and its lease released; the rest
	// of its teardown (its workspace's unmount first) not begun.
	FailDestroyTail = "destroy-tail"
	// A destroy (sandboxinit, retire): the session's record marked
	// destroyed, its kill running beside it or done, its lease held, no
	// answer sent.
	FailDestroyRecorded = "destroy-recorded"
	// A warm session's build (sandboxinit): its record written, its
	// session started and its builder's lease still held, before it joins
	// the pool.
	FailWarmBuild = "warm-build"
	// A warm session's move onto a newer head (sandboxinit, rehead): the
	// old head's overlay unmounted, the new head's not yet mounted, the
	// lease of the create adopting it (or of the builder) held.
	FailWarmRehead = "warm-rehead"
	// A session moved in place onto a new head (sandboxinit, after a
	// publish with keep or a refresh): its workspace unmounted, its record
	// not yet saved, the new overlay not mounted.
	FailMoveInPlace = "move-in-place"
	// The boot finishing such a move (sandboxinit, finishMove): the new
	// upper dir made or the refresh's merge renamed into place, the
	// session's record not yet saved.
	FailFinishMove = "finish-move"
)

// Error failpoints: armed as "error:<name>" (in FailpointEnv or the
// failpoint file), the write they stand for fails once with ErrInjected,
// as it would on a full volume, and the process goes on.
const (
	// A publish's own record written with its commit (CommitRecord):
	// the commit goes on without it.
	FailCommitRecord = "commit-record"
	// An exactly-once publish's record completed after its commit
	// (sandboxinit: a publish with keep, or one whose commit could not
	// write the record).
	FailPublishRecord = "publish-record"
	// A lost transaction record written again from its layer's metadata
	// (Committed): TxRecord then answers from the metadata.
	FailRebuildRecord = "rebuild-record"
	// The lease a publish with keep takes for its session after its
	// commit point (acquireKeptLocked).
	FailKeepLease = "keep-lease"
	// Stopping a workspace session in its teardown (sandboxinit; not a
	// warm one): the close of a published or destroyed session fails, as
	// a stuck runtime would make it fail.
	FailSessionTeardown = "session-teardown"
	// A session runtime's destroy in a stop (sandboxinit): it fails and
	// the runtime (its container, processes, cgroup) lives on.
	FailRuntimeDestroy = "runtime-destroy"
	// A session runtime's kill in a destroy (sandboxinit): it fails and
	// the runtime's processes live on (with runtime-destroy armed too,
	// the destroy's teardown cannot end them either).
	FailRuntimeKill = "runtime-kill"
)

// ErrInjected is the error of an armed error failpoint.
var ErrInjected = errors.New("injected failure (an error failpoint)")

// errorArm is how an error failpoint is named where it is armed.
func errorArm(name string) string { return "error:" + name }

// CommitFailpoints lists the commit path's failpoints in order.
var CommitFailpoints = []string{FailAfterStaging, FailAfterRename, FailAfterMeta, FailAfterSync, FailAfterManifest, FailAfterAudit, FailAfterTx}

// FailpointFile, when present in a store's root, arms the failpoints it
// names (one per line) once: the first one reached deletes the file, then
// kills the process. It lets end-to-end tests crash a daemon they cannot
// set the environment of; only the store's owner can write its root.
const FailpointFile = ".failpoints"

type failpoints map[string]bool

func failpointsFromEnv() failpoints {
	v := os.Getenv(FailpointEnv)
	if v == "" {
		return nil
	}
	f := failpoints{}
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			f[n] = true
		}
	}
	return f
}

func (f failpoints) hit(name string) {
	if f[name] {
		die()
	}
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Injected returns ErrInjected if the error failpoint name is armed (once,
// for the failpoint file, which it then deletes), and nil otherwise: the
// store's owner calls it where a write stands that a test must make fail
// (FailPublishRecord).
func (s *Store) Injected(name string) error {
	if s.fail[errorArm(name)] || s.takeArmed(errorArm(name)) {
		return fmt.Errorf("%s: %w", name, ErrInjected)
	}
	return nil
}

// Hit is hit for a failpoint of the store's owner (FailDestroyTail, FailDestroyRecorded,
// FailWarmBuild, FailWarmRehead, FailMoveInPlace).
func (s *Store) Hit(name string) { s.hit(name) }

// hit checks the environment's failpoints and the store's failpoint file.
func (s *Store) hit(name string) {
	s.fail.hit(name)
	if s.takeArmed(name) {
		die()
	}
}

// takeArmed reports whether the store's failpoint file names arm, taking
// its line out if so (a failpoint of the file fires once; the file goes
// with its last line). The others stay armed: a test can crash a process,
// then the boot that recovers from it.
func (s *Store) takeArmed(arm string) bool {
	file := s.root + "/" + FailpointFile
	b, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	var rest []string
	found := false
	for _, l := range strings.Split(string(b), "\n") {
		switch t := strings.TrimSpace(l); {
		case t == arm && !found:
			found = true
		case t != "":
			rest = append(rest, t)
		}
	}
	if !found {
		return false
	}
	if len(rest) == 0 {
		_ = os.Remove(file)
		_ = atomicfile.SyncDir(s.root)
	} else {
		_ = atomicfile.WriteFile(file, []byte(strings.Join(rest, "\n")+"\n"), 0o600)
	}
	return true
}
