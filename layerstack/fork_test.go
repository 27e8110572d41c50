package layerstack

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestForkCopiesTheDeltaAndSharesTheLayers: a fork's upper holds the
// forked session's changes as a private copy (later writes of either side
// are not seen by the other), its lease pins the same layers, and when
// the forked session publishes first the fork's publish of the same
// changes merges as identical, not as conflicts.
func TestForkCopiesTheDeltaAndSharesTheLayers(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "a\n", "gone.txt": "g\n", "keep.txt": "k\n"})
	x := mustLease(t, s, "workspace_session:ws-x")
	upperX := filepath.Join(t.TempDir(), "upper")
	writeTree(t, upperX, tree{"a.txt": "a-by-x\n", "tool.sh*": "#!/bin/sh\n", "new/b.bin": "\x00\x01"})
	require.NoError(t, writeWhiteout(filepath.Join(upperX, "gone.txt")))

	cs, err := Capture(upperX)
	require.NoError(t, err)
	upperF := filepath.Join(t.TempDir(), "fork-upper")
	res, err := s.Fork(context.Background(), x.ID, cs, upperF, "workspace_session:ws-f")
	cs.Close()
	require.NoError(t, err)
	require.Equal(t, x.Layers, res.Lease.Layers)
	require.Equal(t, x.ManifestVersion, res.Lease.ManifestVersion)
	require.Equal(t, "workspace_session:ws-f", res.Lease.Owner)

	// The same view: the fork's upper over the same layers.
	viewOf := func(upper string, l *Lease) tree {
		return readTree(t, NewView(append([]string{upper}, s.LowerDirs(l)...)...))
	}
	require.Equal(t, viewOf(upperX, x), viewOf(upperF, res.Lease))
	// Private: X writing in place after the fork is not seen by the fork,
	// and the other way round.
	require.NoError(t, os.WriteFile(filepath.Join(upperX, "a.txt"), []byte("x-later\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(upperF, "new/b.bin"), []byte("fork-later"), 0o644))
	vx, vf := viewOf(upperX, x), viewOf(upperF, res.Lease)
	require.Equal(t, "a-by-x\n", vf["a.txt"])
	require.Equal(t, "\x00\x01", vx["new/b.bin"])
	require.NotContains(t, vf, "gone.txt")
	require.Contains(t, vf, "tool.sh*")

	// X publishes; the fork's change set (X's changes plus its own) then
	// lands on top without conflicts.
	csX, err := Capture(upperX)
	require.NoError(t, err)
	_, err = s.Publish(context.Background(), PublishRequest{TxID: nextTx(), LeaseID: x.ID, Changes: csX, Owner: "workspace_session:ws-x"})
	csX.Close()
	require.NoError(t, err)
	// (The fork's own later b.bin change would be a binary conflict with
	// X's published one: put X's back, and add a file of its own.)
	require.NoError(t, os.WriteFile(filepath.Join(upperF, "new/b.bin"), []byte("\x00\x01"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(upperF, "fork.txt"), []byte("mine\n"), 0o644))
	publishFork := func() error {
		csF, err := Capture(upperF)
		require.NoError(t, err)
		defer csF.Close()
		_, err = s.Publish(context.Background(), PublishRequest{TxID: nextTx(), LeaseID: res.Lease.ID, Changes: csF, Owner: "workspace_session:ws-f"})
		return err
	}
	// X rewrote a.txt after the fork and published that: the fork's copy
	// of X's earlier line is a divergence like any other.
	err = publishFork()
	require.True(t, IsConflict(err), "%v", err)
	require.Contains(t, err.Error(), "a.txt")
	require.NoError(t, os.WriteFile(filepath.Join(upperF, "a.txt"), []byte("x-later\n"), 0o644))
	require.NoError(t, publishFork())
	require.Equal(t, "x-later\n", headFile(t, s, "a.txt"))
	require.Equal(t, "mine\n", headFile(t, s, "fork.txt"))
	require.Equal(t, "\x00\x01", headFile(t, s, "new/b.bin"))
	requireHealthy(t, s)

	// A fork of an unknown lease makes nothing.
	cs2, err := Capture(upperX)
	require.NoError(t, err)
	defer cs2.Close()
	bad := filepath.Join(t.TempDir(), "bad")
	_, err = s.Fork(context.Background(), "lease-nope", cs2, bad, "workspace_session:ws-g")
	require.ErrorIs(t, err, ErrUnknownLease)
	require.NoDirExists(t, bad)
}
