package sandboxinit

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// A sandbox at max_sessions refuses one more session with resource_exhausted
// before it takes a lease or touches the runtime; a destroyed session frees
// its place.
func TestMaxSessionsRefusesWithResourceExhausted(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": "x\n"})
	d.cfg.MaxSessions = 2
	workSession(t, d, "ws-a", nil)
	workSession(t, d, "ws-b", nil)
	leases := len(d.store.Leases())
	for _, implicit := range []bool{false, true} {
		_, err := d.createSession(ctx, api.CreateSessionArgs{}, implicit)
		e := requireKind(t, err, api.KindResourceExhausted)
		require.Equal(t, "max_sessions", e.Details["limit"])
		require.Equal(t, 2, e.Details["max"])
		require.Contains(t, e.Message, "max_sessions")
	}
	require.Len(t, d.store.Leases(), leases, "a refused create leaves no lease")
	require.Equal(t, 0, d.creating)

	_, err := d.destroySession(ctx, api.DestroySessionArgs{WorkspaceSessionID: "ws-a"})
	require.NoError(t, err)
	release, err := d.admitSession()
	require.NoError(t, err, "a destroyed session frees its place")
	_, err = d.admitSession()
	requireKind(t, err, api.KindResourceExhausted)
	release()
}

// A change set larger than max_publish_bytes is refused, by the one-shot
// publish and by prepare, before anything is frozen; the session stays
// active with its work, and a smaller change set publishes.
func TestMaxPublishBytesRefusesBeforeFreezing(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": "x\n"})
	d.cfg.MaxPublishBytes = 1000
	workSession(t, d, "ws-big", map[string]string{"a.bin": strings.Repeat("a", 600), "b.bin": strings.Repeat("b", 600)})
	workSession(t, d, "ws-small", map[string]string{"c.txt": strings.Repeat("c", 900)})

	_, err := d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-big"})
	e := requireKind(t, err, api.KindResourceExhausted)
	require.Equal(t, "max_publish_bytes", e.Details["limit"])
	require.EqualValues(t, 1000, e.Details["max"])
	require.EqualValues(t, 1200, e.Details["change_set_bytes"])
	require.Contains(t, e.Message, "max_publish_bytes (1000)")
	require.Equal(t, StateActive, stateOf(t, d, "ws-big"))

	_, err = d.publishPrepare(ctx, step("tx-big", "ws-big"))
	requireKind(t, err, api.KindResourceExhausted)
	_, statErr := os.Stat(d.txDir("tx-big"))
	require.ErrorIs(t, statErr, os.ErrNotExist, "nothing was frozen")
	require.Equal(t, StateActive, stateOf(t, d, "ws-big"))
	require.Empty(t, headFile(t, d, "a.bin"))

	_, err = d.publishSession(ctx, api.PublishArgs{WorkspaceSessionID: "ws-small"})
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("c", 900), headFile(t, d, "c.txt"))
}
