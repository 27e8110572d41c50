package sandboxinit

import (
	"context"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// TestSweepSessionLeases: at start, the leases of sessions that do not
// exist (a create or fork killed between leasing and recording its
// session) and a warm build's are released; live sessions' and other
// owners' leases stay.
func TestSweepSessionLeases(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"a.txt": "a\n"})
	live := workSession(t, d, "ws-live", map[string]string{"b.txt": "b\n"})
	ghost, err := d.store.Acquire("workspace_session:ws-ghost")
	require.NoError(t, err)
	warmBuild, err := d.store.Acquire(warmLeaseOwner + "ws-warm") // a warm build the daemon died in
	require.NoError(t, err)
	other, err := d.store.Acquire("export")
	require.NoError(t, err)
	// An archived session is not live but its lease is what a restore needs.
	idle := workSession(t, d, "ws-idle", map[string]string{"c.txt": "c\n"})
	_, err = d.archive(context.Background(), idle, "rid-archive")
	require.NoError(t, err)

	d.sweepSessionLeases(context.Background())
	var held []string
	for _, l := range d.store.Leases() {
		held = append(held, l.ID)
	}
	sort.Strings(held)
	want := []string{live.rec.LeaseID, other.ID, idle.rec.LeaseID}
	sort.Strings(want)
	require.Equal(t, want, held)
	_, err = d.store.Lease(ghost.ID)
	require.Error(t, err)
	_, err = d.store.Lease(warmBuild.ID)
	require.Error(t, err)

	// Restarted over the same state, the sweep finds nothing more to do.
	nd := restart(t, d)
	nd.sweepSessionLeases(context.Background())
	require.Len(t, nd.store.Leases(), 3)
	res, err := nd.restoreArchived(context.Background(), "rid-restore", api.SessionArgs{WorkspaceSessionID: "ws-idle"})
	require.NoError(t, err)
	require.False(t, res.Rebased, "restored over its own base")
}
