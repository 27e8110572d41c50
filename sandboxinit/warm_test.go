package sandboxinit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/observe"
)

// TestAdoptWaitsAreCounted: a create that finds no warm session ready while
// a build runs waits for that build, and the daemon view counts it
// (warm_session.waited, waited_ms: a pool too small for its sandbox); a
// create that finds no build running neither waits nor counts.
func TestAdoptWaitsAreCounted(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"a.txt": "a\n"})
	ctx := context.Background()
	stats := func() map[string]any { return observed{d}.WarmStats() }

	require.Nil(t, d.adoptWarm(ctx, api.CreateSessionArgs{}), "no pool, no build: nothing to adopt")
	require.EqualValues(t, 0, stats()["waited"])

	const buildTime = 60 * time.Millisecond
	d.mu.Lock()
	d.warm.building, d.warm.done = 1, make(chan struct{})
	d.mu.Unlock()
	adopted := make(chan *session, 1)
	go func() { adopted <- d.adoptWarm(ctx, api.CreateSessionArgs{}) }()
	require.Eventually(t, func() bool { return stats()["waited"] == 1 }, 10*time.Second, time.Millisecond, "the create waits for the build")
	time.Sleep(buildTime) // the build goes on meanwhile
	select {
	case <-adopted:
		t.Fatal("the create did not wait for the build to end")
	default:
	}
	d.mu.Lock()
	d.buildEndedLocked(nil, errors.New("the build failed"))
	d.mu.Unlock()
	require.Nil(t, <-adopted, "the build it waited for failed: nothing to adopt")
	st := stats()
	require.EqualValues(t, 1, st["waited"], "%v", st)
	require.GreaterOrEqual(t, st["waited_ms"], buildTime.Milliseconds(), "%v", st)

	require.Nil(t, d.adoptWarm(ctx, api.CreateSessionArgs{}))
	require.EqualValues(t, 1, stats()["waited"], "no build running: no wait counted")
}

// TestWarmBuildLeasesAreNotCounted: the lease a warm build holds for its
// milliseconds is the daemon's own, at moments no caller chooses, so the
// views' lease counts (layerstack, snapshot) leave it out; a workspace's
// lease is counted. The seed's suite reads active_lease_count right after
// a publish, when the pool is being rebuilt on the new head.
func TestWarmBuildLeasesAreNotCounted(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"a.txt": "a\n"})
	count := func() any {
		v, err := d.obs.LayerstackView(observe.LayerstackArgs{})
		require.NoError(t, err)
		return v["active_lease_count"]
	}
	require.EqualValues(t, 0, count())
	warm, err := d.store.Hold(warmLeaseOwner + "ws-warm")
	require.NoError(t, err)
	require.EqualValues(t, 0, count(), "a warm build's lease is not a workspace's")
	ws, err := d.store.Acquire("workspace_session:ws-a")
	require.NoError(t, err)
	require.EqualValues(t, 1, count(), "a workspace's lease is counted")
	require.EqualValues(t, 1, d.obs.Snapshot(observe.ScopeArgs{})["stack"].(map[string]any)["active_leases"], "and so in the snapshot")
	require.NoError(t, d.store.Release(warm.ID))
	require.NoError(t, d.store.Release(ws.ID))
	require.EqualValues(t, 0, count())
}
