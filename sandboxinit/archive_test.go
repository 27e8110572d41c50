package sandboxinit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// TestArchiveAndRestoreKeepWork: idle sessions are archived with their
// work and their lease (an empty one too), a retried archive call reports
// the same sessions, the archive survives a daemon restart, and a restore
// brings a session back over the same lease with its files; bad restores
// are refused and change nothing.
func TestArchiveAndRestoreKeepWork(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"a.txt": "base\n"})
	s1 := workSession(t, d, "ws-one", map[string]string{"notes.md": "hi\n", "dir/b.txt": "b\n"})
	s1.rec.Agent = "agent-1"
	require.NoError(t, s1.save())
	s2 := workSession(t, d, "ws-two", nil)
	s3 := workSession(t, d, "ws-busy", map[string]string{"x": "x"})
	lease1 := s1.rec.LeaseID
	old := time.Now().Add(-time.Hour).UnixNano()
	s1.act.last.Store(old)
	s2.act.last.Store(old)
	_ = s3 // used just now: not idle

	res, err := d.archiveIdle(ctx, "reap/1", ArchiveIdleArgs{IdleForMS: 60_000})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"ws-one", "ws-two"}, ids(res.Archived))
	again, err := d.archiveIdle(ctx, "reap/1", ArchiveIdleArgs{IdleForMS: 60_000})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"ws-one", "ws-two"}, ids(again.Archived), "a retried call reports what it archived")
	other, err := d.archiveIdle(ctx, "reap/2", ArchiveIdleArgs{IdleForMS: 60_000})
	require.NoError(t, err)
	require.Empty(t, other.Archived)
	_, err = d.archiveIdle(ctx, "reap/3", ArchiveIdleArgs{IdleForMS: -1})
	requireKind(t, err, api.KindInvalidRequest)
	_, err = d.session("ws-one")
	requireKind(t, err, api.KindNotFound)
	_, err = d.store.Lease(lease1)
	require.NoError(t, err, "an archived session keeps its lease (its base)")

	d = restart(t, d)
	list := d.listArchived()
	require.Len(t, list, 2)
	byID := map[string]ArchivedSession{}
	for _, a := range list {
		byID[a.ID] = a
	}
	require.Equal(t, 2, byID["ws-one"].FilesChanged)
	require.Equal(t, "agent-1", byID["ws-one"].Agent)
	require.True(t, byID["ws-one"].Restorable)
	require.False(t, byID["ws-one"].Archived.IsZero())
	require.Equal(t, 0, byID["ws-two"].FilesChanged)
	_, err = d.session("ws-one")
	requireKind(t, err, api.KindNotFound)

	before := listDir(t, filepath.Join(d.cfg.StateDir, "archive"))
	_, err = d.restoreArchived(ctx, "r1", api.SessionArgs{WorkspaceSessionID: "ws-nope"})
	requireKind(t, err, api.KindNotFound)
	_, err = d.restoreArchived(ctx, "r1", api.SessionArgs{WorkspaceSessionID: "../ws-one"})
	requireKind(t, err, api.KindInvalidRequest)
	_, err = d.restoreArchived(ctx, "r1", api.SessionArgs{WorkspaceSessionID: "ws-busy"})
	requireKind(t, err, api.KindFailedPrecondition)
	require.Equal(t, before, listDir(t, filepath.Join(d.cfg.StateDir, "archive")), "a refused restore changes nothing")

	out, err := d.restoreArchived(ctx, "r1", api.SessionArgs{WorkspaceSessionID: "ws-one"})
	require.NoError(t, err)
	require.Equal(t, StateActive, out.State)
	require.Equal(t, 2, out.FilesChanged)
	require.False(t, out.Rebased)
	s, err := d.session("ws-one")
	require.NoError(t, err)
	require.Equal(t, lease1, s.rec.LeaseID, "restored over the base it started from")
	b, err := os.ReadFile(filepath.Join(s.upper(), "notes.md"))
	require.NoError(t, err)
	require.Equal(t, "hi\n", string(b))
	same, err := d.restoreArchived(ctx, "r1", api.SessionArgs{WorkspaceSessionID: "ws-one"})
	require.NoError(t, err, "a retried restore answers the same")
	require.Equal(t, out.WorkspaceSessionID, same.WorkspaceSessionID)
	_, err = d.restoreArchived(ctx, "r2", api.SessionArgs{WorkspaceSessionID: "ws-one"})
	requireKind(t, err, api.KindFailedPrecondition)
	require.Len(t, d.listArchived(), 1)

	// The restored session survives a restart as an ordinary session.
	d = restart(t, d)
	_, err = d.session("ws-one")
	require.NoError(t, err)
}

func ids(a []ArchivedSession) []string {
	out := []string{}
	for _, x := range a {
		out = append(out, x.ID)
	}
	return out
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := []string{}
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
