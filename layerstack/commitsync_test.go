package layerstack

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A commit writes its transaction record without waiting for the disk: a
// power cut may lose it or leave it torn. These tests do that to the record
// and check the store still answers the transaction exactly once.

func tearTxRecord(t *testing.T, s *Store, txid string, remove bool) {
	t.Helper()
	name := filepath.Join(s.Root(), dirTxns, txKey(txid)+".json")
	if remove {
		require.NoError(t, os.Remove(name))
	} else {
		require.NoError(t, os.Truncate(name, 0))
	}
	_, err := s.readTx(txid)
	require.Error(t, err)
}

// Lost at boot (a power cut) or while the store runs (a write error the
// commit only logs): the boot sweep, or Committed finding the txid in the
// head, rewrites the record from the layer's metadata, and a retry replays
// it instead of committing again.
func TestLostTxRecordIsRebuilt(t *testing.T) {
	for _, atBoot := range []bool{true, false} {
		for _, remove := range []bool{false, true} {
			t.Run(fmt.Sprintf("at-boot=%v/removed=%v", atBoot, remove), func(t *testing.T) {
				s := newTestStore(t, tree{"a": "a\n"})
				l := mustLease(t, s, sess1)
				req := PublishRequest{TxID: "tx-lost", LeaseID: l.ID, Changes: writes("a", "b\n"), Owner: sess1}
				first, err := s.Publish(context.Background(), req)
				require.NoError(t, err)
				tearTxRecord(t, s, "tx-lost", remove)
				if atBoot {
					root := s.Root()
					require.NoError(t, s.Close())
					s, err = Open(root, Options{})
					require.NoError(t, err)
					defer s.Close()
				}
				ok, err := s.Committed("tx-lost")
				require.NoError(t, err)
				require.True(t, ok, "rewritten from the layer's metadata")
				again, err := s.Publish(context.Background(), req)
				require.NoError(t, err)
				require.True(t, again.Replayed)
				require.Equal(t, first.LayerID, again.LayerID)
				require.Equal(t, first.Revision, again.Revision)
				ok, err = s.Committed("tx-never")
				require.NoError(t, err)
				require.False(t, ok)
				m, _ := s.Manifest()
				require.Len(t, m.Layers, 2, "committed once")
				requireHealthy(t, s)
			})
		}
	}
}

// A lost record that cannot be written again (a full volume) does not hide
// the commit: TxRecord answers from the layer's metadata, with the owner and
// the lease the publish was made on, and writes the record once it can.
func TestTxRecordAnswersFromTheLayerWhenTheRecordCannotBeRewritten(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	l := mustLease(t, s, sess1)
	first, err := s.Publish(context.Background(), PublishRequest{TxID: "tx-full", LeaseID: l.ID, Changes: writes("a", "b\n"), Owner: sess1})
	require.NoError(t, err)
	tearTxRecord(t, s, "tx-full", true)
	require.NoError(t, os.WriteFile(filepath.Join(s.Root(), FailpointFile), []byte(errorArm(FailRebuildRecord)+"\n"), 0o600))

	ok, err := s.Committed("tx-full")
	require.True(t, ok, "found in the head")
	require.ErrorIs(t, err, ErrInjected, "the record could not be written again")
	require.NoError(t, os.WriteFile(filepath.Join(s.Root(), FailpointFile), []byte(errorArm(FailRebuildRecord)+"\n"), 0o600))
	r, err := s.TxRecord("tx-full")
	require.NoError(t, err)
	require.True(t, r.Replayed)
	require.Equal(t, first.LayerID, r.LayerID)
	require.Equal(t, first.Revision, r.Revision)
	require.Equal(t, sess1, r.Owner)
	require.Equal(t, l.ID, r.FromLease)
	_, err = s.readTx("tx-full")
	require.True(t, isNotExist(err), "still not written: %v", err)

	// The volume has room again: the record is written back.
	r, err = s.TxRecord("tx-full")
	require.NoError(t, err)
	require.Equal(t, first.LayerID, r.LayerID)
	_, err = s.readTx("tx-full")
	require.NoError(t, err)
	// A txid the head does not hold is still unknown.
	_, err = s.TxRecord("tx-never")
	require.ErrorIs(t, err, fs.ErrNotExist)
	requireHealthy(t, s)
}

// A retried publish whose record a commit never wrote (it failed after its
// commit point: re-leasing, the directory's flush) is replayed from the
// layer, not committed a second time; with keep it gets its lease.
func TestPublishReplaysAnUnrecordedCommit(t *testing.T) {
	for _, keep := range []bool{false, true} {
		s := newTestStore(t, tree{"a": "a\n"})
		l := mustLease(t, s, sess1)
		req := PublishRequest{TxID: "tx-u", LeaseID: l.ID, Changes: writes("a", "b\n"), Owner: sess1, Keep: keep}
		first, err := s.Publish(context.Background(), req)
		require.NoError(t, err)
		tearTxRecord(t, s, "tx-u", true)
		again, err := s.Publish(context.Background(), req)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.LayerID, again.LayerID)
		if keep {
			_, err := s.Lease(again.LeaseID)
			require.NoError(t, err)
		}
		m, _ := s.Manifest()
		require.Len(t, m.Layers, 2, "committed once")
		requireHealthy(t, s)
	}
}

// A squash drops the folded layers' txids from the manifest, after which
// only the records say those transactions committed: it must make them
// durable first, rewriting a lost one from the metadata.
func TestSquashMakesTxRecordsDurableFirst(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"}, Options{AutoSquashAt: -1})
	var results []*PublishResult
	for i := 0; i < 3; i++ {
		l := mustLease(t, s, sess1)
		r, err := s.Publish(context.Background(), PublishRequest{TxID: fmt.Sprintf("sq-%d", i), LeaseID: l.ID,
			Changes: writes(fmt.Sprintf("f%d", i), "x\n"), Owner: sess1})
		require.NoError(t, err)
		require.NoError(t, s.Release(l.ID))
		results = append(results, r)
	}
	tearTxRecord(t, s, "sq-0", false)
	tearTxRecord(t, s, "sq-1", true)
	res, err := s.Squash(context.Background())
	require.NoError(t, err)
	require.Len(t, res.SquashedBlocks, 1)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 2)
	for i, want := range results {
		got, err := s.readTx(fmt.Sprintf("sq-%d", i))
		require.NoError(t, err, "record %d", i)
		require.Equal(t, want.LayerID, got.LayerID)
		// A retry after the squash replays; it does not commit again.
		l := mustLease(t, s, sess1)
		r, err := s.Publish(context.Background(), PublishRequest{TxID: fmt.Sprintf("sq-%d", i), LeaseID: l.ID,
			Changes: writes(fmt.Sprintf("f%d", i), "x\n"), Owner: sess1})
		require.NoError(t, err)
		require.True(t, r.Replayed)
		require.NoError(t, s.Release(l.ID))
	}
	m, _ = s.Manifest()
	require.Len(t, m.Layers, 2)
	requireHealthy(t, s)
}

// A commit leaves nothing pending behind: the next manifest it wrote in
// staging was renamed into place, and no temp record is left in txns/.
func TestCommitLeavesNoPendingFiles(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	for i := 0; i < 2; i++ {
		cs := writes("a", fmt.Sprintf("v%d\n", i))
		if i == 1 {
			// Enough entries for the syncfs path.
			for k := 0; k < syncfsThreshold+2; k++ {
				cs.Changes = append(cs.Changes, Change{Path: fmt.Sprintf("d/f%d", k), Kind: ChangeWrite, Mode: 0o644, Data: []byte("x")})
			}
		}
		_, err := publishOn(t, s, mustLease(t, s, sess1), sess1, cs)
		require.NoError(t, err)
	}
	s.tidy.Wait() // a committed publish's staging goes after its answer
	ents, err := os.ReadDir(filepath.Join(s.Root(), dirStaging))
	require.NoError(t, err)
	require.Empty(t, ents)
	ents, err = os.ReadDir(filepath.Join(s.Root(), dirTxns))
	require.NoError(t, err)
	for _, e := range ents {
		require.NotEqual(t, byte('.'), e.Name()[0], "temp record %s left behind", e.Name())
	}
	m, _ := s.Manifest()
	require.Equal(t, int64(3), m.Version)
	require.Equal(t, "v1\n", headFile(t, s, "a"))
	requireHealthy(t, s)
}

// A caller's record (CommitRecord) is written by a commit and by nothing
// else: a rejected publish, a no-op and a replay leave none, and a record
// that cannot be written does not fail the commit (Written says so).
func TestCommitRecord(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	dir := t.TempDir()
	rec := func(name string) *CommitRecord {
		return &CommitRecord{Path: filepath.Join(dir, name, "record.json"), Data: []byte(name)}
	}
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	r1 := rec("one")
	_, err := s.Publish(context.Background(), PublishRequest{TxID: "t1", LeaseID: l1.ID, Changes: writes("a", "one\n"), Owner: sess1, Record: r1})
	require.NoError(t, err)
	require.True(t, r1.Written)
	b, err := os.ReadFile(r1.Path)
	require.NoError(t, err)
	require.Equal(t, "one", string(b))

	r2 := rec("two") // a conflict with t1 on the same line
	_, err = s.Publish(context.Background(), PublishRequest{TxID: "t2", LeaseID: l2.ID, Changes: writes("a", "two\n"), Owner: sess2, Record: r2})
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.False(t, r2.Written)
	_, err = os.Stat(r2.Path)
	require.True(t, os.IsNotExist(err), "a rejected publish writes no record: %v", err)

	r3 := rec("replay")
	res, err := s.Publish(context.Background(), PublishRequest{TxID: "t1", LeaseID: l1.ID, Changes: writes("a", "one\n"), Owner: sess1, Record: r3})
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.False(t, r3.Written)

	r4 := rec("noop")
	res, err = s.Publish(context.Background(), PublishRequest{TxID: "t4", LeaseID: mustLease(t, s, sess1).ID, Changes: &ChangeSet{}, Owner: sess1, Record: r4})
	require.NoError(t, err)
	require.True(t, res.NoOp)
	require.False(t, r4.Written)

	blocked := filepath.Join(dir, "blocked")
	require.NoError(t, os.WriteFile(blocked, nil, 0o600)) // no directory can be made under it
	r5 := &CommitRecord{Path: filepath.Join(blocked, "txns", "record.json"), Data: []byte("x")}
	res, err = s.Publish(context.Background(), PublishRequest{TxID: "t5", LeaseID: mustLease(t, s, sess1).ID, Changes: writes("b", "b\n"), Owner: sess1, Record: r5})
	require.NoError(t, err, "the commit stands without the caller's record")
	require.False(t, res.NoOp)
	require.False(t, r5.Written)
	c, err := s.Committed("t5")
	require.NoError(t, err)
	require.True(t, c)

	// The same through the error failpoint an end-to-end test arms.
	require.NoError(t, os.WriteFile(filepath.Join(s.Root(), FailpointFile), []byte(errorArm(FailCommitRecord)+"\n"), 0o600))
	r6 := rec("six")
	res, err = s.Publish(context.Background(), PublishRequest{TxID: "t6", LeaseID: mustLease(t, s, sess1).ID, Changes: writes("c", "c\n"), Owner: sess1, Record: r6})
	require.NoError(t, err, "the commit stands without the caller's record")
	require.False(t, res.NoOp)
	require.False(t, r6.Written)
	_, err = os.Stat(r6.Path)
	require.True(t, os.IsNotExist(err), "no record: %v", err)
	_, err = os.Stat(filepath.Join(s.Root(), FailpointFile))
	require.True(t, os.IsNotExist(err), "the failpoint fired once: %v", err)
	requireHealthy(t, s)
}

// An error failpoint fires once from the failpoint file (which it then
// deletes), every time from the environment, and never for another name.
func TestInjected(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	file := filepath.Join(s.Root(), FailpointFile)
	require.NoError(t, os.WriteFile(file, []byte(FailAfterSync+"\n"+errorArm(FailPublishRecord)+"\n"), 0o600))
	require.NoError(t, s.Injected(FailCommitRecord))
	err := s.Injected(FailPublishRecord)
	require.ErrorIs(t, err, ErrInjected)
	require.NoError(t, s.Injected(FailPublishRecord), "once")
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, FailAfterSync+"\n", string(b), "the other failpoint stays armed")
	require.NoError(t, os.Remove(file))

	t.Setenv(FailpointEnv, errorArm(FailPublishRecord))
	env := newTestStore(t, tree{"a": "a\n"})
	require.ErrorIs(t, env.Injected(FailPublishRecord), ErrInjected)
	require.ErrorIs(t, env.Injected(FailPublishRecord), ErrInjected)
	require.NoError(t, env.Injected(FailCommitRecord))
}

// Verify and Close hold the commit lock while they wait for committed
// publishes' staging to go; a publish with keep releases its old lease
// (which takes that lock) after its commit. Side by side they must not
// wait for each other.
func TestVerifyBesideKeepPublishes(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	done := make(chan struct{})
	verified := make(chan error, 1)
	go func() {
		for {
			select {
			case <-done:
				verified <- nil
				return
			default:
			}
			if _, err := s.Verify(context.Background()); err != nil {
				verified <- err
				return
			}
		}
	}()
	finished := make(chan error, 1)
	go func() {
		l := mustLease(t, s, sess1)
		for i := 0; i < 40; i++ {
			r, err := s.Publish(context.Background(), PublishRequest{TxID: fmt.Sprintf("keep-%d", i), LeaseID: l.ID,
				Changes: writes(fmt.Sprintf("f%d", i), "x\n"), Owner: sess1, Keep: true})
			if err != nil {
				finished <- err
				return
			}
			if l, err = s.Lease(r.LeaseID); err != nil {
				finished <- err
				return
			}
		}
		finished <- nil
	}()
	select {
	case err := <-finished:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("keep publishes beside Verify did not finish: they wait for each other")
	}
	close(done)
	require.NoError(t, <-verified)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return")
	}
}

// A txid names one publish: replayed for its owner (or a caller that names
// none), refused for another owner with nothing changed, however the
// request is made (keep included); the record keeps owner and keep.
func TestTxIDOfAnotherOwner(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	res, err := s.Publish(context.Background(), PublishRequest{TxID: "t1", LeaseID: l1.ID, Changes: writes("a", "one\n"), Owner: sess1, Keep: true})
	require.NoError(t, err)
	require.Equal(t, sess1, res.Owner)
	require.True(t, res.Keep)
	rec, err := s.TxRecord("t1")
	require.NoError(t, err)
	require.True(t, rec.Replayed)
	require.Equal(t, res.LeaseID, rec.LeaseID)
	require.Equal(t, sess1, rec.Owner)
	require.Equal(t, l1.ID, rec.FromLease)
	kept, err := s.Lease(res.LeaseID)
	require.NoError(t, err)
	require.Equal(t, "t1", kept.KeptBy, "the lease names the publish that took it")
	require.Equal(t, l1.ID, kept.Replaces)
	noop, err := s.Publish(context.Background(), PublishRequest{TxID: "t0", LeaseID: kept.ID, Changes: &ChangeSet{}, Owner: sess1, Keep: true})
	require.NoError(t, err)
	require.True(t, noop.NoOp)
	require.Equal(t, sess1, noop.Owner, "a no-op's record names its owner too")
	require.Equal(t, kept.ID, noop.FromLease)
	nl, err := s.Lease(noop.LeaseID)
	require.NoError(t, err)
	require.Equal(t, kept.ID, nl.Replaces)
	leases := len(s.Leases())

	for _, keep := range []bool{false, true} {
		_, err = s.Publish(context.Background(), PublishRequest{TxID: "t1", LeaseID: l2.ID, Changes: writes("b", "b\n"), Owner: sess2, Keep: keep})
		require.ErrorIs(t, err, ErrTxTaken)
		require.ErrorIs(t, err, ErrBadRequest)
	}
	_, err = s.Lease(l2.ID)
	require.NoError(t, err, "the other owner's lease is left alone")
	require.Len(t, s.Leases(), leases)
	h, err := s.History(0)
	require.NoError(t, err)
	require.Len(t, h, 1, "nothing committed but t1")

	again, err := s.Publish(context.Background(), PublishRequest{TxID: "t1"})
	require.NoError(t, err, "a caller that names no owner gets the record")
	require.True(t, again.Replayed)
	_, err = s.TxRecord("t-none")
	require.ErrorIs(t, err, fs.ErrNotExist)
	requireHealthy(t, s)
}
