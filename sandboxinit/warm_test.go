package sandboxinit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
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
