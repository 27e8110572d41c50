package sandboxinit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// armErrors arms the error failpoints names (each line fires once) in
// d's store's failpoint file.
func armErrors(t *testing.T, d *Daemon, names ...string) {
	t.Helper()
	var b strings.Builder
	for _, n := range names {
		b.WriteString("error:" + n + "\n")
	}
	require.NoError(t, os.WriteFile(filepath.Join(d.store.Root(), layerstack.FailpointFile), []byte(b.String()), 0o600))
}

// implicitCommand runs what finishImplicit runs for implicit session s once
// its command ended (the publish, then the close of a failed one) and
// returns the outcome and the command's output with it.
func implicitCommand(t *testing.T, d *Daemon, s *session) (map[string]any, *api.CommandOutput, error) {
	t.Helper()
	s.gate.Lock()
	res, err := d.publishLocked(context.Background(), s, api.PublishArgs{TxID: s.ownTxID()})
	if err != nil {
		res, err = d.closeImplicit(context.Background(), s, err)
	}
	s.gate.Unlock()
	out := &api.CommandOutput{Status: api.StatusOK}
	implicitOutcome(res, err)(out)
	return res, out, err
}

// A published session whose close fails stays listed, finalize_failed,
// taking no writes, and recover_workspace_session closes it from the
// commit's record: before, the failed close took it out of the session
// table (recover answered not_found) while its dir and upper dir stayed.
// Every door that closes a session after its commit: a plain publish,
// publish_finalize, and an exactly-once publish's close after its answer.
func TestPublishedSessionCloseFails(t *testing.T) {
	ctx := context.Background()
	for _, door := range []string{"publish", "publish_finalize", "exactly_once"} {
		t.Run(door, func(t *testing.T) {
			d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
			s := workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
			armErrors(t, d, layerstack.FailSessionTeardown)
			switch door {
			case "publish":
				_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-a"})
				e := requireKind(t, err, api.KindOperationFailed)
				require.Equal(t, true, e.Details["publish_completed"], "%v", e)
			case "publish_finalize":
				_, err := d.publishPrepare(ctx, step("tx-a", "ws-a"))
				require.NoError(t, err)
				_, err = d.publishCommit(ctx, step("tx-a", "ws-a"))
				require.NoError(t, err)
				_, err = d.publishFinalize(ctx, step("tx-a", "ws-a"))
				requireKind(t, err, api.KindOperationFailed)
			case "exactly_once":
				res, err := d.publishTx(ctx, txArgs("tx-a", "ws-a"))
				require.NoError(t, err, "the commit is the answer; the close comes after it")
				require.True(t, res.Destroyed)
				d.waitFinalizes(ctx)
			}
			require.Equal(t, "published\n", headFile(t, d, "new.txt"))
			require.Equal(t, StateFinalizeFailed, stateOf(t, d, "ws-a"))
			_, err := d.fileWrite(ctx, "r1", api.FileWriteArgs{WorkspaceSessionID: "ws-a", Path: "late.txt", Content: "late\n"})
			requireKind(t, err, api.KindOperationFailed)
			require.DirExists(t, s.dir)

			if door == "publish" {
				// The next boot closes it too, from the commit's record.
				d = restart(t, d)
			} else {
				rec, err := d.recoverSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-a"})
				require.NoError(t, err)
				require.True(t, rec.Destroyed, "%+v", rec)
			}
			_, err = d.session("ws-a")
			requireKind(t, err, api.KindNotFound)
			require.NoDirExists(t, s.dir)
			require.Equal(t, "published\n", headFile(t, d, "new.txt"))
		})
	}
}

// An implicit session (a bare command's) whose publish committed but whose
// close failed reports the publish as its command's outcome, not
// publish_failed: the command's changes are in the head, and an agent told
// otherwise would run the command again. When the close fails twice, the
// session stays listed, finalize_failed, for recover_workspace_session.
func TestImplicitPublishCommittedCloseFails(t *testing.T) {
	ctx := context.Background()
	for _, fails := range []int{1, 2} {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		s := workSession(t, d, "ws-i", map[string]string{"cmd.txt": "ran\n"})
		s.rec.Implicit = true
		arm := []string{layerstack.FailSessionTeardown}
		if fails == 2 {
			arm = append(arm, layerstack.FailSessionTeardown)
		}
		armErrors(t, d, arm...)
		res, out, err := implicitCommand(t, d, s)
		require.NoError(t, err)
		require.Nil(t, out.PublishRejected, "fails %d: %+v", fails, out)
		pub, ok := res["publish"].(*api.PublishSummary)
		require.True(t, ok, "%v", res)
		require.Equal(t, s.ownTxID(), pub.TxID)
		require.False(t, pub.NoOp)
		require.Equal(t, "ran\n", headFile(t, d, "cmd.txt"))
		if fails == 1 {
			require.Equal(t, true, res["destroyed"])
			_, err = d.session("ws-i")
			requireKind(t, err, api.KindNotFound)
			continue
		}
		require.Equal(t, false, res["destroyed"])
		require.Equal(t, StateFinalizeFailed, stateOf(t, d, "ws-i"))
		rec, err := d.recoverSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-i"})
		require.NoError(t, err)
		require.True(t, rec.Destroyed, "%+v", rec)
		require.Equal(t, "ran\n", headFile(t, d, "cmd.txt"))
	}
}

// A rejected implicit publish still reports its conflicts (the commit did
// not happen: nothing to report as published), even when its close fails.
func TestImplicitPublishRejectedStaysRejected(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-i", map[string]string{"f.txt": strings.Replace(base10, "5\n", "mine\n", 1)})
	s.rec.Implicit = true
	workSession(t, d, "ws-b", map[string]string{"f.txt": strings.Replace(base10, "5\n", "theirs\n", 1)})
	_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-b"})
	require.NoError(t, err)
	armErrors(t, d, layerstack.FailSessionTeardown)
	res, out, err := implicitCommand(t, d, s)
	require.Error(t, err)
	require.Nil(t, res)
	require.NotNil(t, out.PublishRejected)
	require.Equal(t, layerstack.ReasonSourceConflict, out.PublishRejectClass)
	require.Contains(t, headFile(t, d, "f.txt"), "theirs\n")
}

// A publish without exactly_once naming a txid another session's publish
// committed (its own derived txid, or any) is refused as invalid_request
// with nothing changed, not answered as its own commit left unfinished
// (which made the session finalize_failed, refusing its writes); a bare
// command whose implicit txid was taken so reports publish_failed, not
// the other session's publish as its own.
func TestPublishTxIDTakenByAnotherSession(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	workSession(t, d, "ws-b", map[string]string{"b.txt": "b\n"})
	_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-b", TxID: "implicit:ws-i"})
	require.NoError(t, err)
	h := layers(t, d)

	workSession(t, d, "ws-a", map[string]string{"a.txt": "a\n"})
	_, err = d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-a", TxID: "implicit:ws-i"})
	requireKind(t, err, api.KindInvalidRequest)
	require.Equal(t, StateActive, stateOf(t, d, "ws-a"))
	_, err = d.fileWrite(ctx, "r1", api.FileWriteArgs{WorkspaceSessionID: "ws-a", Path: "more.txt", Content: "more\n"})
	require.NoError(t, err, "the session takes writes: nothing of it was committed")
	require.Equal(t, h, layers(t, d))

	s := workSession(t, d, "ws-i", map[string]string{"cmd.txt": "ran\n"})
	s.rec.Implicit = true
	res, out, err := implicitCommand(t, d, s)
	require.Error(t, err)
	require.Nil(t, res, "ws-b's publish is not this command's")
	require.NotNil(t, out.PublishRejected)
	require.Equal(t, "publish_failed", out.PublishRejectClass)
	require.Equal(t, h, layers(t, d))
}

// A no-op publish whose close failed (nothing in its upper dir, its lease
// released) is closed at the next boot, not restarted as an active
// session on a new lease.
func TestNoOpPublishCloseFailsBoot(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	for _, implicit := range []bool{false, true} {
		s := workSession(t, d, "ws-n", nil)
		s.rec.Implicit = implicit
		require.NoError(t, s.save())
		armErrors(t, d, layerstack.FailSessionTeardown)
		if implicit {
			s.gate.Lock()
			_, err := d.publishLocked(ctx, s, api.PublishArgs{TxID: s.ownTxID()})
			s.gate.Unlock()
			requireKind(t, err, api.KindOperationFailed)
		} else {
			_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-n"})
			requireKind(t, err, api.KindOperationFailed)
		}
		require.Equal(t, StateFinalizeFailed, stateOf(t, d, "ws-n"))
		d = restartWithRestore(t, d)
		_, err := d.session("ws-n")
		requireKind(t, err, api.KindNotFound)
		require.NoDirExists(t, s.dir)
	}
}

// restartWithRestore is restart with the boot's restore of each session
// (the part of restore that runs before the runtime, which these
// in-process daemons do not have: every session here has lost its lease)
// before the reconcile, in the boot's order.
func restartWithRestore(t *testing.T, d *Daemon) *Daemon {
	t.Helper()
	return restartWith(t, d, func(nd *Daemon, s *session) {
		if _, err := nd.store.Lease(s.rec.LeaseID); err == nil {
			t.Fatalf("session %s still has its lease: restore would start its runtime", s.rec.ID)
		}
		require.ErrorIs(t, nd.restore(context.Background(), s), errClosedByCommit)
		s.setState(StateFinalizeFailed)
	})
}

// An implicit session whose commit stands although the store failed after
// its commit point, on a volume too full to write the commit's lost record
// again, reports the publish as its command's outcome (from the layer's
// metadata), not publish_failed: an agent told otherwise would run the
// command again.
func TestImplicitPublishCommittedRecordNotRewritable(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-i", map[string]string{"cmd.txt": "ran\n"})
	s.rec.Implicit = true
	// The commit, its session left over (its close failing twice), then
	// its record lost.
	armErrors(t, d, layerstack.FailSessionTeardown, layerstack.FailSessionTeardown)
	first, _, err := implicitCommand(t, d, s)
	require.NoError(t, err)
	require.Equal(t, false, first["destroyed"])
	sum := sha256.Sum256([]byte(s.ownTxID()))
	record := filepath.Join(d.store.Root(), "txns", hex.EncodeToString(sum[:16])+".json")
	require.FileExists(t, record)
	require.NoError(t, os.Remove(record))

	// What finishImplicit sees when the store fails after the commit point
	// (the root's fsync) and the record cannot be written again.
	armErrors(t, d, layerstack.FailRebuildRecord)
	res, err := d.closeImplicit(ctx, s, d.committedButFailed(s, s.ownTxID(), errors.New("sync the store's root: input/output error")))
	require.NoError(t, err)
	out := &api.CommandOutput{Status: api.StatusOK}
	implicitOutcome(res, err)(out)
	require.Nil(t, out.PublishRejected, "%+v", out)
	pub, ok := res["publish"].(*api.PublishSummary)
	require.True(t, ok, "%v", res)
	require.Equal(t, s.ownTxID(), pub.TxID)
	require.Equal(t, first["publish"].(*api.PublishSummary).LayerID, pub.LayerID)
	require.Equal(t, true, res["destroyed"])
	_, err = d.session("ws-i")
	requireKind(t, err, api.KindNotFound)
	require.Equal(t, "ran\n", headFile(t, d, "cmd.txt"))
}
