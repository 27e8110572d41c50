package layerstack

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// StageOnHead writes the would-be head of a change set (the head's
// changes merged under it) without touching the source lease, also when
// that lease is on the head; a conflict writes nothing.
func TestStageOnHeadKeepsTheSourceLease(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n4\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	up := filepath.Join(t.TempDir(), "up0")
	r0, err := s.StageOnHead(context.Background(), l1.ID, writes("mine.txt", "m\n"), up, "verify:1")
	require.NoError(t, err, "a lease on the head is staged too")
	require.Equal(t, tree{"mine.txt": "m\n"}, dirTree(t, up))
	require.NotEqual(t, l1.ID, r0.LeaseID)
	staged, err := s.Lease(r0.LeaseID)
	require.NoError(t, err)
	require.Empty(t, staged.Replaces, "a staged lease replaces none: the source is kept")
	_, err = publishOn(t, s, l2, sess2, writes("f.txt", "ONE\n2\n3\n4\n"))
	require.NoError(t, err)
	up1 := filepath.Join(t.TempDir(), "up1")
	r1, err := s.StageOnHead(context.Background(), l1.ID, writes("f.txt", "1\n2\n3\nFOUR\n"), up1, "verify:2")
	require.NoError(t, err)
	require.Equal(t, tree{"f.txt": "ONE\n2\n3\nFOUR\n"}, dirTree(t, up1))
	require.EqualValues(t, 2, r1.Revision.ManifestVersion)
	_, err = s.Lease(l1.ID)
	require.NoError(t, err, "the source lease is kept")
	up2 := filepath.Join(t.TempDir(), "up2")
	_, err = s.StageOnHead(context.Background(), l1.ID, writes("f.txt", "uno\n2\n3\n4\n"), up2, "verify:3")
	requireConflict(t, err, "f.txt", ConflictContent)
	require.NoDirExists(t, up2)
}

// ExpectVersion commits only onto that head: compare and commit.
func TestPublishExpectVersion(t *testing.T) {
	s := newTestStore(t, tree{"f.txt": "1\n2\n3\n"})
	l1, l2 := mustLease(t, s, sess1), mustLease(t, s, sess2)
	m, _ := s.Manifest()
	_, err := publishOn(t, s, l2, sess2, writes("g.txt", "g\n"))
	require.NoError(t, err)
	_, err = s.Publish(context.Background(), PublishRequest{TxID: nextTx(), LeaseID: l1.ID, Owner: sess1, Changes: writes("h.txt", "h\n"), ExpectVersion: m.Version})
	var moved *HeadMovedError
	require.True(t, errors.As(err, &moved), "%v", err)
	require.Equal(t, m.Version, moved.Expected)
	require.Equal(t, m.Version+1, moved.Head.ManifestVersion)
	now, _ := s.Manifest()
	require.Equal(t, m.Version+1, now.Version, "nothing committed")
	res, err := s.Publish(context.Background(), PublishRequest{TxID: nextTx(), LeaseID: l1.ID, Owner: sess1, Changes: writes("h.txt", "h\n"), ExpectVersion: now.Version})
	require.NoError(t, err)
	require.Equal(t, now.Version+1, res.Revision.ManifestVersion)
	require.Equal(t, "h\n", headFile(t, s, "h.txt"))
}
