package layerstack

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The crash tests run a publish in a child process (this test binary again)
// that SIGKILLs itself at one failpoint of the commit path, then reopen the
// store and check it is exactly the old or the new state.

const (
	crashRootEnv  = "LAYERSTACK_CRASH_ROOT"
	crashLeaseEnv = "LAYERSTACK_CRASH_LEASE"
	crashMoveEnv  = "LAYERSTACK_CRASH_MOVE" // the head moves under the child's build
	crashTxID     = "crash-tx"
	crashRecord   = `{"caller":"record"}`
)

// crashRecordPath is where the child's publish asks its commit to write the
// caller's record (CommitRecord): beside the store, in a directory the
// commit makes.
func crashRecordPath(root string) string {
	return filepath.Join(filepath.Dir(root), "caller", "txns", "tx", "record.json")
}

func crashChanges() *ChangeSet {
	return &ChangeSet{Changes: []Change{
		{Path: "f.txt", Kind: ChangeWrite, Mode: 0o644, Data: []byte("1\n2\nours\n")},
		{Path: "new/dir/n.txt", Kind: ChangeWrite, Mode: 0o755, Data: []byte("new\n")},
		{Path: "gone.txt", Kind: ChangeDelete},
	}}
}

// TestCrashChild is the child side; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	root := os.Getenv(crashRootEnv)
	if root == "" {
		return
	}
	s, err := Open(root, Options{})
	require.NoError(t, err)
	if os.Getenv(crashMoveEnv) != "" {
		// Another session's publish of a path of its own commits while
		// this one's layer is built: this one commits that layer on the
		// new head (untouchedSince), and dies there.
		moved, moving := false, false
		s.afterBuild = func() {
			switch {
			case moving: // the other publish's own build
			case moved:
				os.Exit(3) // built again: the parent sees no SIGKILL
			default:
				moved, moving = true, true
				armed := s.fail // the failpoint is this publish's, not the other's
				s.fail = nil
				_, err := publishOn(t, s, mustLease(t, s, sess2), sess2, writes("other/o.txt", "o\n"))
				s.fail, moving = armed, false
				require.NoError(t, err)
			}
		}
	}
	_, err = s.Publish(context.Background(), PublishRequest{TxID: crashTxID, LeaseID: os.Getenv(crashLeaseEnv),
		Changes: crashChanges(), Owner: sess1, Record: &CommitRecord{Path: crashRecordPath(root), Data: []byte(crashRecord)}})
	require.NoError(t, err)
	os.Exit(0)
}

func TestCrashConsistencyAtEveryFailpoint(t *testing.T) {
	for _, fp := range CommitFailpoints {
		t.Run(fp, func(t *testing.T) { crashAt(t, fp, false) })
		// The same with the head moved under the build by a publish of
		// other paths: the layer is committed on the new head as built.
		t.Run(fp+"/head-moved", func(t *testing.T) { crashAt(t, fp, true) })
	}
}

// crashAt runs the child publish, killed at fp, and checks the store it
// leaves is the old or the new state, and that a retry completes it once.
func crashAt(t *testing.T, fp string, moved bool) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n", "gone.txt": "bye\n"})
	l, err := s.Acquire(sess1)
	require.NoError(t, err)
	// A concurrent publish lands first, so ours merges.
	_, err = publishOn(t, s, mustLease(t, s, sess2), sess2, writes("f.txt", "ONE\n2\n3\n"))
	require.NoError(t, err)
	l0 := mustLease(t, s, sess2) // pins the pre-crash head
	before, _ := s.Manifest()
	beforeTree := readTree(t, s.Head())
	root := s.Root()
	require.NoError(t, s.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashRootEnv+"="+root, crashLeaseEnv+"="+l.ID, FailpointEnv+"="+fp)
	if moved {
		// The other publish commits in the child before the crash:
		// it is part of the old state.
		cmd.Env = append(cmd.Env, crashMoveEnv+"=1")
		beforeTree["other/"], beforeTree["other/o.txt"] = "", "o\n"
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "child must die at %s: %v\n%s", fp, err, out)
	ws, ok := ee.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed by SIGKILL at %s: %v\n%s", fp, err, out)

	s2, err := Open(root, Options{})
	require.NoError(t, err)
	defer s2.Close()
	after, _ := s2.Manifest()
	others := 0
	if moved {
		others = 1
	}
	committed := after.Version == before.Version+int64(others)+1
	if !committed {
		require.Equal(t, before.Version+int64(others), after.Version, "old state exactly")
		if !moved {
			require.Equal(t, before.RootHash(), after.RootHash(), "old state exactly")
		}
		require.Equal(t, beforeTree, readTree(t, s2.Head()))
	}
	require.Equal(t, committed, fp != FailAfterStaging && fp != FailAfterRename && fp != FailAfterMeta && fp != FailAfterSync,
		"the manifest rename is the commit point")
	// The caller's record is written with the flush: on disk
	// whenever the commit is, and left behind by a crash between
	// the flush and the commit point, where Committed says void.
	rec, rerr := os.ReadFile(crashRecordPath(root))
	if committed || fp == FailAfterSync {
		require.NoError(t, rerr, "the record is on disk at %s", fp)
		require.Equal(t, crashRecord, string(rec))
	} else {
		require.True(t, os.IsNotExist(rerr), "no record before the flush (%s): %v", fp, rerr)
	}
	c, err := s2.Committed(crashTxID)
	require.NoError(t, err)
	require.Equal(t, committed, c)
	problems, err := s2.Verify(context.Background())
	require.NoError(t, err)
	require.Empty(t, problems)

	// Retry the same transaction: it completes exactly once.
	for i := 0; i < 2; i++ {
		r, err := s2.Publish(context.Background(), PublishRequest{TxID: crashTxID, LeaseID: l.ID, Changes: crashChanges(), Owner: sess1})
		require.NoError(t, err)
		require.Equal(t, committed || i > 0, r.Replayed)
	}
	final, _ := s2.Manifest()
	require.Len(t, final.Layers, len(before.Layers)+others+1)
	n := 0
	for _, ly := range final.Layers {
		if ly.TxID == crashTxID {
			n++
		}
	}
	require.Equal(t, 1, n, "exactly one layer carries the transaction")
	require.Equal(t, "ONE\n2\nours\n", headFile(t, s2, "f.txt"))
	require.Equal(t, "new\n", headFile(t, s2, "new/dir/n.txt"))
	_, err = s2.Head().Stat("gone.txt")
	require.ErrorIs(t, err, os.ErrNotExist)
	if moved {
		require.Equal(t, "o\n", headFile(t, s2, "other/o.txt"))
		delete(beforeTree, "other/")
		delete(beforeTree, "other/o.txt")
	}
	v, err := s2.View(l0.ID)
	require.NoError(t, err)
	require.Equal(t, beforeTree, readTree(t, v), "a lease taken before the crash still reads its state")
	problems, err = s2.Verify(context.Background())
	require.NoError(t, err)
	require.Empty(t, problems)
	s2.tidy.Wait() // a committed publish's staging goes after its answer
	ents, _ := os.ReadDir(filepath.Join(root, dirStaging))
	require.Empty(t, ents)
}
