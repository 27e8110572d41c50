package sandboxinit

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/command"
)

// These tests drive the publish steps in process, without the session
// runtime (as observe_test.go does): a session is a record, an upper dir
// and a lease. They need root for the layer store's overlay probe.

// publishDaemon opens a daemon over state dir dir; base (path -> content)
// is imported when the store is new.
func publishDaemon(t *testing.T, dir string, base map[string]string) *Daemon {
	t.Helper()
	return openTestDaemon(t, dir, base, nil)
}

// openTestDaemon opens an in-process daemon (no session runtime) over state
// dir dir, importing base (path -> content) when the store is new; tune
// adjusts the configuration.
func openTestDaemon(t *testing.T, dir string, base map[string]string, tune func(*Config)) *Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (the layer store probes overlay mounts): run it as root, as make test does")
	}
	cfg := Config{StateDir: dir, SandboxID: "eos-test", Logger: slog.New(slog.DiscardHandler)}
	if tune != nil {
		tune(&cfg)
	}
	cfg.defaults()
	for _, sub := range []string{"sessions", "archive", "txns"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, sub), 0o700))
	}
	store, err := layerstack.Open(filepath.Join(dir, "layerstack"), layerstack.Options{Logger: cfg.Logger})
	require.NoError(t, err)
	if _, err := store.Manifest(); err != nil {
		src := t.TempDir()
		for p, c := range base {
			require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(src, p), []byte(c), 0o644))
		}
		info, _, err := layerstack.ImportDir(context.Background(), src, filepath.Join(store.Root(), "base"), layerstack.ImportOptions{All: true})
		require.NoError(t, err)
		_, err = store.Init(context.Background(), info)
		require.NoError(t, err)
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, tokenSum: sha256.Sum256([]byte(testToken)), store: store, cmds: command.New(command.Options{}),
		sessions: map[string]*session{}, started: time.Now(), lane: newLane(cfg.BackgroundLanes, cfg.BackgroundQueueWait, cfg.BackgroundNice, cfg.Logger)}
	require.NoError(t, d.openObservability())
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

// restart closes d and opens a daemon over its state dir, bringing the
// recorded sessions back as restoreSessions does (without a runtime), then
// reconciling the unfinished publishes as New does.
func restart(t *testing.T, d *Daemon) *Daemon {
	t.Helper()
	return restartWith(t, d, nil)
}

// restartWith is restart, calling each (when set) on every session read
// back before it is listed.
func restartWith(t *testing.T, d *Daemon, each func(nd *Daemon, s *session)) *Daemon {
	t.Helper()
	require.NoError(t, d.Close(context.Background()))
	nd := publishDaemon(t, d.cfg.StateDir, nil)
	ents, err := os.ReadDir(filepath.Join(nd.cfg.StateDir, "sessions"))
	require.NoError(t, err)
	for _, e := range ents {
		s := &session{dir: filepath.Join(nd.cfg.StateDir, "sessions", e.Name()), state: StateActive}
		require.NoError(t, readJSON(filepath.Join(s.dir, "session.json"), &s.rec))
		if nd.pendingPublish(s.rec.ID) {
			s.setState(StatePublishing)
		}
		if each != nil {
			each(nd, s)
		}
		nd.sessions[s.rec.ID] = s
	}
	nd.reconcilePublishes(context.Background())
	return nd
}

// workSession registers a session without a runtime whose upper dir holds
// files (path -> content), with its record saved as createSession does.
func workSession(t *testing.T, d *Daemon, id string, files map[string]string) *session {
	t.Helper()
	s := &session{state: StateActive, rec: sessionRecord{ID: id, NetworkProfile: "shared", Upper: "upper-0", Created: time.Now().UTC()}}
	s.dir = filepath.Join(d.cfg.StateDir, "sessions", id)
	lease, err := d.store.Acquire(s.owner())
	require.NoError(t, err)
	s.rec.LeaseID = lease.ID
	require.NoError(t, os.MkdirAll(s.upper(), 0o755))
	for p, c := range files {
		full := filepath.Join(s.upper(), p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(c), 0o644))
	}
	require.NoError(t, os.MkdirAll(s.merged(), 0o755))
	require.NoError(t, s.save())
	s.act.touch()
	d.mu.Lock()
	d.sessions[id] = s
	d.mu.Unlock()
	return s
}

func stateOf(t *testing.T, d *Daemon, id string) string {
	t.Helper()
	s, err := d.session(id)
	require.NoError(t, err)
	return s.seen().state
}

func headFile(t *testing.T, d *Daemon, p string) string {
	t.Helper()
	b, _, err := d.store.Head().ReadFile(p, 1<<20)
	if err != nil {
		return ""
	}
	return string(b)
}

func requireKind(t *testing.T, err error, kind string) *api.Error {
	t.Helper()
	require.Error(t, err)
	e := api.AsError(err)
	require.Equal(t, kind, e.Kind, "%v", err)
	return e
}

func step(txid, ws string) api.PublishStepArgs {
	return api.PublishStepArgs{TxID: txid, WorkspaceSessionID: ws}
}

const base10 = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"

// A prepare that is rejected or fails leaves the session active and
// nothing prepared; an abort of that txid is a no-op that keeps a late
// prepare of it from preparing.
func TestPrepareFailureLeavesSessionActive(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	workSession(t, d, "ws-a", map[string]string{"f.txt": strings.Replace(base10, "3\n", "THREE\n", 1)})
	workSession(t, d, "ws-b", map[string]string{"f.txt": strings.Replace(base10, "3\n", "three\n", 1)})
	_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-a"})
	require.NoError(t, err)

	t.Run("rejected", func(t *testing.T) {
		res, err := d.publishPrepare(ctx, step("tx-b", "ws-b"))
		require.NoError(t, err)
		require.False(t, res.Clean)
		require.NotEmpty(t, res.Conflicts)
		require.Equal(t, StateActive, stateOf(t, d, "ws-b"), "a rejected prepare leaves the session active")
		_, err = d.loadPrepared("tx-b")
		require.Error(t, err, "nothing prepared")
		ab, err := d.publishAbort(ctx, step("tx-b", "ws-b"))
		require.NoError(t, err, "the abort of a txid never prepared is a no-op")
		require.True(t, ab.NotPrepared)
		_, err = d.publishPrepare(ctx, step("tx-b", "ws-b"))
		requireKind(t, err, api.KindOperationFailed)
		require.Equal(t, StateActive, stateOf(t, d, "ws-b"), "a prepare after its abort prepares nothing")
	})
	t.Run("capture fails", func(t *testing.T) {
		s := workSession(t, d, "ws-c", map[string]string{"c.txt": "c\n"})
		require.NoError(t, os.RemoveAll(s.upper()))
		_, err := d.publishPrepare(ctx, step("tx-c", "ws-c"))
		e := requireKind(t, err, api.KindOperationFailed)
		require.Contains(t, e.Message, "capture failed")
		require.NotContains(t, e.Message, d.cfg.StateDir, "no state volume path reaches the client")
		require.Equal(t, StateActive, stateOf(t, d, "ws-c"))
		_, err = d.loadPrepared("tx-c")
		require.Error(t, err, "nothing prepared")
		ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "txns"))
		for _, e := range ents {
			_, err := os.Stat(filepath.Join(d.cfg.StateDir, "txns", e.Name(), "files"))
			require.True(t, os.IsNotExist(err) || e.Name() != filepath.Base(d.txDir("tx-c")), "no frozen files left behind")
		}
	})
}

// A publish that waited for the gate of a session a destroy then removed
// answers not_found, never a capture error naming the state volume.
func TestPublishRacingDestroyIsNotFound(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	for _, tc := range []struct {
		name string
		call func(id string) error
	}{
		{"publish_prepare", func(id string) error { _, err := d.publishPrepare(ctx, step("tx-"+id, id)); return err }},
		{"publish_workspace_session", func(id string) error {
			_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: id})
			return err
		}},
		{"refresh_workspace_session", func(id string) error {
			_, err := d.refreshSession(ctx, api.SessionArgs{WorkspaceSessionID: id})
			return err
		}},
		{"destroy_workspace_session", func(id string) error {
			_, err := d.destroySession(ctx, api.DestroySessionArgs{WorkspaceSessionID: id})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "ws-" + strings.ReplaceAll(tc.name, "_", "-")
			s := workSession(t, d, id, map[string]string{"a.txt": "a\n"})
			s.gate.Lock() // the destroy holds the gate...
			errc := make(chan error, 1)
			go func() { errc <- tc.call(id) }()
			require.Never(t, func() bool { return len(errc) > 0 }, 50*time.Millisecond, 5*time.Millisecond, "the call waits for the gate")
			_, err := d.teardown(ctx, s, true) // ...and wins
			require.NoError(t, err)
			s.gate.Unlock()
			e := requireKind(t, <-errc, api.KindNotFound)
			require.Equal(t, "workspace session not found: "+id, e.Message)
		})
	}
	t.Run("capture of a session destroyed meanwhile", func(t *testing.T) {
		s := workSession(t, d, "ws-cap", map[string]string{"a.txt": "a\n"})
		_, err := d.teardown(ctx, s, true)
		require.NoError(t, err)
		_, _, err = d.capture(ctx, s)
		e := requireKind(t, err, api.KindNotFound)
		require.Equal(t, "workspace session not found: ws-cap", e.Message)
	})
}

// A daemon restart settles the publishes it prepared and did not finish:
// uncommitted ones are aborted (the session is active with its work),
// committed ones finalized once.
func TestRestartSettlesUnfinishedPublishes(t *testing.T) {
	ctx := context.Background()
	t.Run("prepared, not committed: aborted", func(t *testing.T) {
		d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
		workSession(t, d, "ws-a", map[string]string{"wip.txt": "unpublished\n"})
		res, err := d.publishPrepare(ctx, step("tx-a", "ws-a"))
		require.NoError(t, err)
		require.True(t, res.Clean)
		require.Equal(t, StatePublishing, stateOf(t, d, "ws-a"))

		d = restart(t, d)
		require.Equal(t, StateActive, stateOf(t, d, "ws-a"), "the session is back for its agent")
		s, _ := d.session("ws-a")
		b, err := os.ReadFile(filepath.Join(s.upper(), "wip.txt"))
		require.NoError(t, err)
		require.Equal(t, "unpublished\n", string(b), "its work is intact")
		_, err = d.publishCommit(ctx, step("tx-a", "ws-a"))
		e := requireKind(t, err, api.KindOperationFailed) // the workflow's retried commit: aborted
		require.Equal(t, AbortedByRestart, e.Details["aborted_by"], "its workflow may start the publish over")
		require.Empty(t, headFile(t, d, "wip.txt"), "nothing was committed")
		out, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-a"})
		require.NoError(t, err, "the session publishes again")
		require.Equal(t, true, out["destroyed"])
		require.Equal(t, "unpublished\n", headFile(t, d, "wip.txt"))
	})
	for _, tc := range []struct {
		name string
		// commit commits tx-a: through the step, or in the store only (a
		// crash between the store's commit and the daemon's record).
		commit func(d *Daemon) error
	}{
		{"committed, not finalized: finalized once", func(d *Daemon) error {
			_, err := d.publishCommit(ctx, step("tx-a", "ws-a"))
			return err
		}},
		{"committed in the store only: finalized, not aborted", func(d *Daemon) error {
			p, err := d.loadPrepared("tx-a")
			if err != nil {
				return err
			}
			_, err = d.store.Publish(ctx, layerstack.PublishRequest{TxID: p.TxID, LeaseID: p.LeaseID, Changes: &p.Changes, Owner: p.Owner})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
			workSession(t, d, "ws-a", map[string]string{"new.txt": "published\n"})
			_, err := d.publishPrepare(ctx, step("tx-a", "ws-a"))
			require.NoError(t, err)
			require.NoError(t, tc.commit(d))
			h0, err := d.store.History(0)
			require.NoError(t, err)

			d = restart(t, d)
			_, err = d.session("ws-a")
			requireKind(t, err, api.KindNotFound) // finalized: the session is closed
			require.Equal(t, "published\n", headFile(t, d, "new.txt"))
			fin, err := d.publishFinalize(ctx, step("tx-a", "ws-a"))
			require.NoError(t, err, "the workflow's retried finalize gets the recorded answer")
			require.True(t, fin.Destroyed)
			h1, err := d.store.History(0)
			require.NoError(t, err)
			require.Equal(t, len(h0), len(h1), "committed exactly once")
			require.Empty(t, d.unfinishedPublishes(""))
		})
	}
}

// recover_workspace_session brings a session in publishing or
// finalize_failed back to active with its upper dir, and finishes a
// committed publish.
func TestRecoverWorkspaceSession(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	h := NewServer(d).http.Handler

	workSession(t, d, "ws-p", map[string]string{"wip.txt": "p\n"})
	_, err := d.publishPrepare(ctx, step("tx-p", "ws-p"))
	require.NoError(t, err)
	code, out := rpc(t, h, "", "exec_command", map[string]any{"cmd": "true", "workspace_session_id": "ws-p"})
	require.Equal(t, 409, code)
	require.Equal(t, "recover_workspace_session", out["error"].(map[string]any)["details"].(map[string]any)["recovery_operation"])
	code, out = rpc(t, h, "", "recover_workspace_session", map[string]any{"workspace_session_id": "ws-p"})
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, "publishing", out["previous_state"])
	require.Equal(t, "active", out["state"])
	require.Equal(t, []any{"tx-p"}, out["aborted_txids"])
	_, err = d.publishCommit(ctx, step("tx-p", "ws-p"))
	require.Equal(t, AbortedByRecover, requireKind(t, err, api.KindOperationFailed).Details["aborted_by"], "aborted on purpose: not started over")
	require.Equal(t, StateActive, stateOf(t, d, "ws-p"))
	s, _ := d.session("ws-p")
	b, err := os.ReadFile(filepath.Join(s.upper(), "wip.txt"))
	require.NoError(t, err)
	require.Equal(t, "p\n", string(b))

	workSession(t, d, "ws-f", map[string]string{"wip.txt": "f\n"})
	sf, _ := d.session("ws-f")
	sf.setState(StateFinalizeFailed)
	r, err := d.recoverSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-f"})
	require.NoError(t, err)
	require.Equal(t, StateFinalizeFailed, r.PreviousState)
	require.Equal(t, StateActive, r.State)
	_, err = d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-f"})
	require.NoError(t, err, "a recovered session publishes")

	workSession(t, d, "ws-c", map[string]string{"c.txt": "c\n"})
	_, err = d.publishPrepare(ctx, step("tx-c", "ws-c"))
	require.NoError(t, err)
	_, err = d.publishCommit(ctx, step("tx-c", "ws-c"))
	require.NoError(t, err)
	r, err = d.recoverSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-c"})
	require.NoError(t, err)
	require.Equal(t, []string{"tx-c"}, r.FinalizedTxIDs)
	require.True(t, r.Destroyed, "finalizing its committed publish closed it")
	require.Equal(t, "c\n", headFile(t, d, "c.txt"))

	_, err = d.recoverSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-nope"})
	requireKind(t, err, api.KindNotFound)
}

// Error messages name workspace paths, never the state volume's.
func TestConfine(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-a", nil)
	err := fmt.Errorf("lstat %s/src/a.go: no such file; open %s/txns/0a1b/files/3: read-only file system; stat %s: gone",
		s.upper(), d.cfg.StateDir, s.upper())
	require.Equal(t, "lstat src/a.go: no such file; open (daemon state): read-only file system; stat .: gone", d.confine(s, err))
	e := api.AsError(d.confineErr(err))
	require.Equal(t, api.KindInternal, e.Kind)
	require.NotContains(t, e.Message, d.cfg.StateDir)
	refusal := api.Errorf(api.KindOperationFailed, map[string]any{"stage": "publish"}, "publish failed: rename %s/layerstack/staging/x: busy", d.cfg.StateDir)
	e = api.AsError(d.confineErr(refusal))
	require.Equal(t, api.KindOperationFailed, e.Kind, "a refusal keeps its kind and details")
	require.Equal(t, "publish", e.Details["stage"])
	require.Equal(t, "publish failed: rename (daemon state): busy", e.Message)
	// A txid naming the sandbox (publish/eos-<uuid>/...) is not a path
	// under a state dir /eos.
	require.Equal(t, "publish publish/eos-1/ws-2/9 aborted; open (daemon state)", hideStatePaths("publish publish/eos-1/ws-2/9 aborted; open /eos/txns/x", "/eos"))
	require.Equal(t, "(daemon state) and (daemon state)", hideStatePaths("/eos and /eos/a/b", "/eos/"))
}
