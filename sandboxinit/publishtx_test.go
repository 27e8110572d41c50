package sandboxinit

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

func txArgs(txid, ws string) api.PublishArgs {
	return api.PublishArgs{TxID: txid, WorkspaceSessionID: ws, ExactlyOnce: true}
}

func layers(t *testing.T, d *Daemon) int {
	t.Helper()
	h, err := d.store.History(0)
	require.NoError(t, err)
	return len(h)
}

// The workflow's publish: one call commits, answers with the finalize
// result, and closes the session after answering; a retry of the txid
// (before or after the close) answers the same and commits nothing more.
func TestPublishTxExactlyOnce(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
	h0 := layers(t, d)
	res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
	require.NoError(t, err)
	require.True(t, res.Clean)
	require.Nil(t, res.Rejection)
	require.True(t, res.Destroyed)
	require.NotNil(t, res.EvictedUpperdirBytes)
	require.Equal(t, "tx-a", res.TxID)
	require.Equal(t, "published\n", headFile(t, d, "new.txt"))
	_, err = d.session("ws-a")
	requireKind(t, err, api.KindNotFound) // gone from the table at once

	again, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
	require.NoError(t, err, "a retry answers from the record")
	require.Equal(t, res.PublishFinalResult, again.PublishFinalResult)
	require.Equal(t, h0+1, layers(t, d), "committed exactly once")
	d.waitFinalizes(ctx)
	_, err = os.Stat(s.dir)
	require.True(t, os.IsNotExist(err), "the session dir is removed after the answer: %v", err)
	require.Empty(t, d.unfinishedPublishes(""))
	p, err := d.loadPrepared("tx-a")
	require.NoError(t, err)
	require.NotNil(t, p.Finalized)
}

// A rejection is an answer: nothing committed, nothing recorded, the
// session active with its changes.
func TestPublishTxRejectionKeepsSession(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	workSession(t, d, "ws-1", map[string]string{"f.txt": "one\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"})
	workSession(t, d, "ws-2", map[string]string{"f.txt": "uno\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"})
	_, err := d.publishTx(ctx, txArgs("tx-1", "ws-1"))
	require.NoError(t, err)
	h := layers(t, d)
	res, err := d.publishTx(ctx, txArgs("tx-2", "ws-2"))
	require.NoError(t, err)
	require.False(t, res.Clean)
	require.NotNil(t, res.Rejection)
	require.Len(t, res.Conflicts, 1)
	require.Equal(t, "f.txt", res.Conflicts[0].Path)
	require.NotEmpty(t, res.Conflicts[0].Hunks, "line ranges")
	require.Equal(t, h, layers(t, d))
	require.Equal(t, StateActive, stateOf(t, d, "ws-2"))
	s, _ := d.session("ws-2")
	b, err := os.ReadFile(s.upper() + "/f.txt")
	require.NoError(t, err)
	require.Equal(t, "uno\n", string(b[:4]))
	_, err = d.loadPrepared("tx-2")
	requireKind(t, err, api.KindNotFound)
}

// A publish whose record can be written neither with its commit nor after
// it (a full volume, by two error failpoints) stands: the session is closed
// before the answer, nothing of the record is left for a boot to act on,
// and a retry of the txid answers from the store without committing again.
func TestPublishTxRecordUnwritable(t *testing.T) {
	ctx := context.Background()
	t.Setenv(layerstack.FailpointEnv, "error:"+layerstack.FailCommitRecord+",error:"+layerstack.FailPublishRecord)
	dir := t.TempDir()
	d := publishDaemon(t, dir, map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
	b := workSession(t, d, "ws-b", map[string]string{"b.txt": "b\n"})
	h0 := layers(t, d)
	res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
	require.NoError(t, err)
	require.True(t, res.Clean)
	require.True(t, res.Destroyed)
	require.Equal(t, "published\n", headFile(t, d, "new.txt"))
	_, err = os.Stat(s.dir)
	require.True(t, os.IsNotExist(err), "closed before the answer: %v", err)
	_, err = os.Stat(d.txDir("tx-a"))
	require.True(t, os.IsNotExist(err), "no record: %v", err)
	require.Empty(t, d.unfinishedPublishes(""))

	again, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
	require.NoError(t, err, "a retry answers from the store's record of the txid")
	require.True(t, again.Clean)
	require.Equal(t, res.Publish, again.Publish)
	require.Equal(t, h0+1, layers(t, d), "committed exactly once")
	_, err = d.publishAbort(ctx, step("tx-a", "ws-a"))
	requireKind(t, err, api.KindOperationFailed) // committed: not recorded as aborted
	_, err = d.loadPrepared("tx-a")
	requireKind(t, err, api.KindNotFound)

	// The txid checked against the store's record: not another session's
	// publish, not the other keep.
	_, err = d.publishTx(ctx, txArgs("tx-a", "ws-b"))
	requireKind(t, err, api.KindInvalidRequest)
	kept := txArgs("tx-a", "ws-a")
	kept.Keep = true
	_, err = d.publishTx(ctx, kept)
	requireKind(t, err, api.KindInvalidRequest)
	// Nor through the steps: ws-b's changes are not prepared under it
	// (the store's commit of tx-a would be taken for theirs).
	_, err = d.publishPrepare(ctx, step("tx-a", "ws-b"))
	requireKind(t, err, api.KindInvalidRequest)
	_, err = d.loadPrepared("tx-a")
	requireKind(t, err, api.KindNotFound)
	require.Equal(t, StateActive, stateOf(t, d, "ws-b"))
	_, err = os.Stat(filepath.Join(b.upper(), "b.txt"))
	require.NoError(t, err, "ws-b keeps its work")
	require.Equal(t, h0+1, layers(t, d))

	require.NoError(t, d.Close(ctx))
	t.Setenv(layerstack.FailpointEnv, "")
	d = publishDaemon(t, dir, nil)
	require.Equal(t, h0+1, layers(t, d))
	require.Empty(t, d.unfinishedPublishes(""))
	_, err = d.session("ws-a")
	requireKind(t, err, api.KindNotFound)
}

// The steps of a publish the store committed without the daemon's record
// (swept a day after, or never written): an abort refuses (committed) and
// records nothing, the finalize it leads to closes the session from the
// store's record.
func TestPublishStepsCommittedWithoutRecord(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
	h0 := layers(t, d)
	_, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: "tx-s", LeaseID: s.rec.LeaseID, Owner: s.owner(),
		Changes: &layerstack.ChangeSet{Changes: []layerstack.Change{{Path: "new.txt", Kind: layerstack.ChangeWrite, Mode: 0o644, Data: []byte("published\n")}}}})
	require.NoError(t, err)

	_, err = d.publishAbort(ctx, step("tx-s", "ws-a"))
	e := requireKind(t, err, api.KindOperationFailed)
	require.Equal(t, true, e.Details["committed"])
	_, err = d.loadPrepared("tx-s")
	requireKind(t, err, api.KindNotFound)
	_, err = d.publishFinalize(ctx, step("tx-s", "ws-b"))
	requireKind(t, err, api.KindInvalidRequest) // not ws-b's publish
	fin, err := d.publishFinalize(ctx, step("tx-s", "ws-a"))
	require.NoError(t, err)
	require.True(t, fin.Destroyed)
	require.Equal(t, h0+1, layers(t, d))
	_, err = d.session("ws-a")
	requireKind(t, err, api.KindNotFound)
}

// A session over a commit of its own that was not finished (its session
// neither closed nor moved: a failure after the commit point) takes no
// writes, and recover_workspace_session finishes that publish instead of
// making the session active over the upper dir the commit took: for a
// publish without a txid (its own txid) and for an exactly-once one whose
// record could not be written (found among the store's records).
func TestRecoverFinishesAnUnfinishedCommit(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	commit := func(s *session, txid, path string) {
		t.Helper()
		_, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: txid, LeaseID: s.rec.LeaseID, Owner: s.owner(),
			Changes: &layerstack.ChangeSet{Changes: []layerstack.Change{{Path: path, Kind: layerstack.ChangeWrite, Mode: 0o644, Data: []byte(path)}}}})
		require.NoError(t, err)
		s.setState(StateFinalizeFailed)
	}
	a := workSession(t, d, "ws-a", map[string]string{"a.txt": "a.txt"})
	b := workSession(t, d, "ws-b", map[string]string{"b.txt": "b.txt"})
	commit(a, a.plainTxID(), "a.txt")
	commit(b, "tx-b", "b.txt")
	// tx-b's record was never written (the commit failed after its commit
	// point on a full volume): only its layer says it committed.
	recs, err := filepath.Glob(filepath.Join(d.store.Root(), "txns", "*.json"))
	require.NoError(t, err)
	for _, f := range recs {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), `"txid":"tx-b"`) {
			require.NoError(t, os.Remove(f))
		}
	}
	h := layers(t, d)
	_, err = d.fileWrite(ctx, "r1", api.FileWriteArgs{WorkspaceSessionID: "ws-a", Path: "late.txt", Content: "late\n"})
	requireKind(t, err, api.KindOperationFailed)
	_, err = d.refreshSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-a"})
	requireKind(t, err, api.KindOperationFailed) // not moved past its unfinished publish

	for _, c := range []struct{ id, txid string }{{"ws-a", a.plainTxID()}, {"ws-b", "tx-b"}} {
		out, err := d.recoverSession(ctx, api.SessionArgs{WorkspaceSessionID: c.id})
		require.NoError(t, err)
		require.Equal(t, []string{c.txid}, out.FinalizedTxIDs)
		require.True(t, out.Destroyed, "%+v", out)
		_, err = d.session(c.id)
		requireKind(t, err, api.KindNotFound)
	}
	require.Equal(t, "a.txt", headFile(t, d, "a.txt"))
	require.Equal(t, "b.txt", headFile(t, d, "b.txt"))
	require.Equal(t, h, layers(t, d), "nothing committed again")
}

// A publish with keep whose commit stands but whose session's new lease
// cannot be taken (a full volume, twice) answers that it committed, and
// the session takes no more writes until it is recovered: they would go
// into the upper dir the commit took.
func TestKeepPublishCommittedButUnfinished(t *testing.T) {
	ctx := context.Background()
	t.Setenv(layerstack.FailpointEnv, "error:"+layerstack.FailKeepLease)
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
	_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-a", Keep: true})
	e := requireKind(t, err, api.KindOperationFailed)
	require.Equal(t, true, e.Details["committed"], "%v", e)
	require.Equal(t, "published\n", headFile(t, d, "new.txt"))
	require.Equal(t, StateFinalizeFailed, stateOf(t, d, "ws-a"))
	_, err = d.fileWrite(ctx, "r1", api.FileWriteArgs{WorkspaceSessionID: "ws-a", Path: "late.txt", Content: "late\n"})
	requireKind(t, err, api.KindOperationFailed)

	args := txArgs("tx-k", "ws-a")
	args.Keep = true
	_, err = d.publishTx(ctx, args) // the exactly-once path, the same way
	requireKind(t, err, api.KindOperationFailed)
}

// A record without its result whose txid the store committed (a verified
// publish whose record could not take the result after its commit, here a
// prepared one committed by the store alone) is finalized by the retry,
// not answered as still prepared.
func TestPublishTxCommittedWithoutResult(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
	h0 := layers(t, d)
	_, err := d.publishPrepare(ctx, step("tx-a", "ws-a"))
	require.NoError(t, err)
	p, err := d.loadPrepared("tx-a")
	require.NoError(t, err)
	_, err = d.store.Publish(ctx, layerstack.PublishRequest{TxID: p.TxID, LeaseID: p.LeaseID, Changes: &p.Changes, Owner: p.Owner})
	require.NoError(t, err)

	res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
	require.NoError(t, err)
	require.True(t, res.Clean)
	require.True(t, res.Destroyed)
	require.Equal(t, "published\n", headFile(t, d, "new.txt"))
	require.Equal(t, h0+1, layers(t, d))
	p, err = d.loadPrepared("tx-a")
	require.NoError(t, err)
	require.NotNil(t, p.Finalized)
}

// A publish that found nothing to commit, retried without the daemon's
// record (lost in a crash before it was written): the session, still on
// the lease the publish was made on, is closed; one made since on the
// same head is not taken for it.
func TestPublishTxNoOpRetried(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-a", nil)
	h0 := layers(t, d)
	res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: "tx-a", LeaseID: s.rec.LeaseID, Changes: &layerstack.ChangeSet{}, Owner: s.owner()})
	require.NoError(t, err)
	require.True(t, res.NoOp)

	got, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
	require.NoError(t, err)
	require.True(t, got.Clean)
	require.True(t, got.Destroyed)
	require.True(t, got.Publish.NoOp)
	require.Equal(t, h0, layers(t, d))
	_, err = d.session("ws-a")
	requireKind(t, err, api.KindNotFound)

	workSession(t, d, "ws-b", map[string]string{"b.txt": "b\n"})
	_, err = d.publishTx(ctx, txArgs("tx-a", "ws-b"))
	requireKind(t, err, api.KindInvalidRequest)
	require.Equal(t, StateActive, stateOf(t, d, "ws-b"))
}

// A session whose publish is prepared (or verifying) takes no file writes,
// as it takes no commands: its upper dir is what the publish captured, and
// the finalize replaces or removes it. Reads go on; once the publish ends
// (here aborted) writes are taken again.
func TestNoWritesWhilePublishing(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-a", map[string]string{"a.txt": "a\n"})
	_, err := d.publishPrepare(ctx, step("tx-a", "ws-a"))
	require.NoError(t, err)
	require.Equal(t, StatePublishing, stateOf(t, d, "ws-a"))
	_, err = d.fileWrite(ctx, "r1", api.FileWriteArgs{WorkspaceSessionID: "ws-a", Path: "late.txt", Content: "late\n"})
	requireKind(t, err, api.KindOperationFailed)
	_, err = d.fileDelete(ctx, "r2", api.FileDeleteArgs{WorkspaceSessionID: "ws-a", Path: "a.txt"})
	requireKind(t, err, api.KindOperationFailed)
	_, err = d.fileMove(ctx, "r3", api.FileMoveArgs{WorkspaceSessionID: "ws-a", From: "a.txt", To: "b.txt"})
	requireKind(t, err, api.KindOperationFailed)
	_, err = d.fileEdit(ctx, "r4", api.FileEditArgs{WorkspaceSessionID: "ws-a", Path: "a.txt", Edits: []api.Edit{{OldString: "a", NewString: "b"}}})
	requireKind(t, err, api.KindOperationFailed)
	_, err = os.Stat(filepath.Join(s.merged(), "late.txt"))
	require.True(t, os.IsNotExist(err), "nothing written: %v", err)
	_, err = d.fileList(api.FileListArgs{WorkspaceSessionID: "ws-a"})
	require.NoError(t, err, "reads go on")

	_, err = d.publishAbort(ctx, step("tx-a", "ws-a"))
	require.NoError(t, err)
	_, err = d.fileWrite(ctx, "r5", api.FileWriteArgs{WorkspaceSessionID: "ws-a", Path: "late.txt", Content: "late\n"})
	require.NoError(t, err)
}

// A record from before records named the lease a publish was made on
// (an upgrade): a kept session that has since moved past the commit's head
// is answered as it is, not moved back (its lease taken, its upper dir
// replaced).
func TestPublishTxLegacyRecordMovedOn(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-a", nil)
	keep := func(txid, lease, path string) *layerstack.PublishResult {
		res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: txid, LeaseID: lease, Owner: s.owner(), Keep: true,
			Changes: &layerstack.ChangeSet{Changes: []layerstack.Change{{Path: path, Kind: layerstack.ChangeWrite, Mode: 0o644, Data: []byte(path)}}}})
		require.NoError(t, err)
		return res
	}
	first := keep("tx-k", s.rec.LeaseID, "one.txt")
	second := keep("tx-2", first.LeaseID, "two.txt")
	s.setUpperLease("upper-2", second.LeaseID)
	require.NoError(t, s.save())
	// The record as an older store wrote it.
	recs, err := filepath.Glob(filepath.Join(d.store.Root(), "txns", "*.json"))
	require.NoError(t, err)
	stripped := 0
	for _, f := range recs {
		var m map[string]any
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &m))
		if m["txid"] == "tx-k" {
			delete(m, "from_lease")
			delete(m, "owner")
			delete(m, "keep")
			b, err = json.Marshal(m)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(f, b, 0o644))
			stripped++
		}
	}
	require.Equal(t, 1, stripped)
	h := layers(t, d)

	args := txArgs("tx-k", "ws-a")
	args.Keep = true
	res, err := d.publishTx(ctx, args)
	require.NoError(t, err)
	require.True(t, res.Kept)
	require.Equal(t, second.LeaseID, s.rec.LeaseID, "left where it went")
	require.Equal(t, "upper-2", s.rec.Upper)
	_, err = d.store.Lease(second.LeaseID)
	require.NoError(t, err, "its lease kept")
	require.Equal(t, h, layers(t, d))
}

// Bad input is refused with nothing changed.
func TestPublishTxRefusals(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	workSession(t, d, "ws-a", map[string]string{"a.txt": "a\n"})
	workSession(t, d, "ws-b", map[string]string{"b.txt": "b\n"})
	h := layers(t, d)
	_, err := d.publishTx(ctx, txArgs("", "ws-a"))
	requireKind(t, err, api.KindInvalidRequest)
	_, err = d.publishTx(ctx, txArgs("tx-x", ""))
	requireKind(t, err, api.KindInvalidRequest)
	_, err = d.publishTx(ctx, txArgs("tx-x", "ws-nope"))
	requireKind(t, err, api.KindNotFound)
	require.Equal(t, h, layers(t, d))
	_, err = d.publishTx(ctx, txArgs("tx-a", "ws-a"))
	require.NoError(t, err)
	_, err = d.publishTx(ctx, txArgs("tx-a", "ws-b"))
	requireKind(t, err, api.KindInvalidRequest) // a txid names one publish
	require.Equal(t, StateActive, stateOf(t, d, "ws-b"))
	require.Equal(t, h+1, layers(t, d))
}

// Crash drills: a daemon that dies at each point of an exactly-once publish
// comes back with the publish either not committed (the session active
// with its work, the retry publishes it) or committed once (the session
// closed by the boot reconcile or the retry, which answers clean).
func TestPublishTxCrashPoints(t *testing.T) {
	ctx := context.Background()
	// closedAtBoot restarts d, whose publish tx-a of ws-a committed layer:
	// the boot reconcile closes ws-a, and a retry answers from the record
	// and commits nothing.
	closedAtBoot := func(t *testing.T, d *Daemon, layer string) *Daemon {
		t.Helper()
		h := layers(t, d)
		d = restart(t, d)
		_, err := d.session("ws-a")
		requireKind(t, err, api.KindNotFound)
		again, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
		require.NoError(t, err)
		require.True(t, again.Clean)
		require.True(t, again.Destroyed)
		require.Equal(t, layer, again.Publish.LayerID)
		require.Equal(t, h, layers(t, d))
		return d
	}
	t.Run("committed in the store, not recorded", func(t *testing.T) {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
		cs, release, err := d.capture(ctx, s)
		require.NoError(t, err)
		res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: "tx-a", LeaseID: s.rec.LeaseID, Changes: cs, Owner: s.owner(), SourcesRead: release})
		release()
		require.NoError(t, err)
		// No daemon record: the boot finds the commit made from the
		// session's lease (finishOwnCommits) and closes the session it
		// took the upper dir of; the retry answers from the store.
		d = closedAtBoot(t, d, res.LayerID)
		d.waitFinalizes(ctx)
		require.Empty(t, d.unfinishedPublishes(""))
	})
	t.Run("recorded, not closed", func(t *testing.T) {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
		cs, release, err := d.capture(ctx, s)
		require.NoError(t, err)
		res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: "tx-a", LeaseID: s.rec.LeaseID, Changes: cs, Owner: s.owner(), SourcesRead: release})
		release()
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(d.txDir("tx-a"), 0o700))
		require.NoError(t, d.savePrepared(&preparedPublish{TxID: "tx-a", SessionID: "ws-a", LeaseID: s.rec.LeaseID, Owner: s.owner(), Result: res}))
		d = closedAtBoot(t, d, res.LayerID)
		require.Equal(t, "published\n", headFile(t, d, "new.txt"))
	})
	t.Run("the record cannot be written", func(t *testing.T) {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
		txns := filepath.Join(d.cfg.StateDir, "txns")
		require.NoError(t, os.RemoveAll(txns))
		require.NoError(t, os.WriteFile(txns, nil, 0o600)) // no record can be made under it
		h := layers(t, d)
		res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
		require.NoError(t, err, "the commit stands; the session is closed before the answer")
		require.True(t, res.Destroyed)
		_, err = os.Stat(s.dir)
		require.True(t, os.IsNotExist(err), "closed before the answer: %v", err)
		again, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
		require.NoError(t, err, "a retry answers from the store's record")
		require.Equal(t, res.Publish.LayerID, again.Publish.LayerID)
		require.True(t, again.Destroyed)
		require.Equal(t, h+1, layers(t, d))
		require.NoError(t, os.Remove(txns))
		require.NoError(t, os.MkdirAll(txns, 0o700))
	})
	// The record the commit writes (commitRecord) before its commit
	// point, as a daemon killed between the commit's flush and its
	// manifest rename leaves it.
	intent := func(t *testing.T, d *Daemon, s *session, txid string) *layerstack.CommitRecord {
		t.Helper()
		rec, err := d.commitRecord(&preparedPublish{TxID: txid, SessionID: s.rec.ID, LeaseID: s.rec.LeaseID, Owner: s.owner(), Committing: true})
		require.NoError(t, err)
		return rec
	}
	// A daemon with session ws-a and the record its publish tx-a wrote
	// with a commit that never reached its commit point.
	voidRecordLeft := func(t *testing.T) *Daemon {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		rec := intent(t, d, workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"}), "tx-a")
		require.NoError(t, os.MkdirAll(filepath.Dir(rec.Path), 0o700))
		require.NoError(t, os.WriteFile(rec.Path, rec.Data, 0o600))
		return d
	}
	t.Run("recorded with a commit that did not happen", func(t *testing.T) {
		d := voidRecordLeft(t)
		h := layers(t, d)

		d = restart(t, d)
		require.Equal(t, StateActive, stateOf(t, d, "ws-a"), "void: the session is back with its work, not publishing")
		_, err := d.loadPrepared("tx-a")
		requireKind(t, err, api.KindNotFound)
		require.Empty(t, d.unfinishedPublishes(""))
		require.Equal(t, h, layers(t, d))
		res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
		require.NoError(t, err, "the retry publishes it")
		require.True(t, res.Clean)
		require.True(t, res.Destroyed)
		require.Equal(t, h+1, layers(t, d))
		require.Equal(t, "published\n", headFile(t, d, "new.txt"))
	})
	t.Run("a void record found by the retry", func(t *testing.T) {
		d := voidRecordLeft(t)
		h := layers(t, d)
		res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
		require.NoError(t, err)
		require.True(t, res.Clean)
		require.Equal(t, h+1, layers(t, d), "committed once, not answered from the void record")
		again, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
		require.NoError(t, err)
		require.Equal(t, res.Publish.LayerID, again.Publish.LayerID)
		require.Equal(t, h+1, layers(t, d))
	})
	t.Run("recorded with its commit, not closed", func(t *testing.T) {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
		cs, release, err := d.capture(ctx, s)
		require.NoError(t, err)
		rec := intent(t, d, s, "tx-a")
		res, err := d.store.Publish(ctx, layerstack.PublishRequest{TxID: "tx-a", LeaseID: s.rec.LeaseID, Changes: cs, Owner: s.owner(), SourcesRead: release, Record: rec})
		release()
		require.NoError(t, err)
		require.True(t, rec.Written)
		d = closedAtBoot(t, d, res.LayerID)
		p, err := d.loadPrepared("tx-a")
		require.NoError(t, err)
		require.NotNil(t, p.Finalized, "the boot finalized it from the record the commit wrote")
		require.Equal(t, res.LayerID, p.Result.LayerID)
	})
	t.Run("not committed", func(t *testing.T) {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
		h := layers(t, d)
		d = restart(t, d)
		require.Equal(t, h, layers(t, d))
		res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
		require.NoError(t, err)
		require.True(t, res.Clean)
		require.Equal(t, h+1, layers(t, d))
	})
}

// A session whose lease is gone (a power cut after an adopted warm
// session's record reached the disk and before its lease did) starts on the
// head under a new lease when its upper dir is empty; one holding work is
// not restored.
func TestLeaseEmptySession(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	empty := workSession(t, d, "ws-empty", nil)
	work := workSession(t, d, "ws-work", map[string]string{"new.txt": "work\n"})
	for _, s := range []*session{empty, work} {
		require.NoError(t, d.store.Release(s.rec.LeaseID))
	}
	_, lost := d.store.Lease(empty.rec.LeaseID)
	require.Error(t, lost)
	lease, err := d.leaseEmptySession(empty, lost)
	require.NoError(t, err)
	require.NotEqual(t, empty.rec.LeaseID, lease.ID)
	head, err := d.store.Manifest()
	require.NoError(t, err)
	require.Equal(t, head.Version, lease.ManifestVersion)
	require.Equal(t, empty.owner(), lease.Owner)

	_, lost = d.store.Lease(work.rec.LeaseID)
	_, err = d.leaseEmptySession(work, lost)
	require.ErrorIs(t, err, layerstack.ErrUnknownLease)
	require.Contains(t, err.Error(), work.rec.LeaseID)
}
