package sandboxinit

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// A 3 GiB (sparse) build artifact in a session: the publish is refused by
// the size cap before anything is frozen, diff and check_publish stream it
// (a digest, no whole-file read), and the daemon's memory stays bounded
// throughout. Then, with the artifact deleted, the session publishes.
func TestHugeFileKeepsTheDaemonBounded(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-big", map[string]string{"small.txt": "small\n"})
	big := filepath.Join(s.upper(), "build", "artifact.bin")
	require.NoError(t, os.MkdirAll(filepath.Dir(big), 0o755))
	f, err := os.Create(big)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(3<<30))
	_, err = f.WriteAt([]byte("tail"), 3<<30-4)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	peak := before
	track := func() {
		if h := heap(); h > peak {
			peak = h
		}
	}

	_, err = d.publishPrepare(ctx, step("tx-big", "ws-big"))
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, api.KindResourceExhausted, ae.Kind, "%+v", ae)
	require.Equal(t, "max_publish_bytes", ae.Details["limit"])
	require.Equal(t, StateActive, s.state, "a refused publish leaves the session active")
	track()
	_, statErr := os.Stat(d.txDir("tx-big"))
	require.ErrorIs(t, statErr, os.ErrNotExist, "nothing was frozen")

	diff, err := d.diffSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-big"})
	require.NoError(t, err)
	require.Contains(t, diff["diff"], "build/artifact.bin")
	track()
	_, err = d.checkPublish(ctx, api.SessionArgs{WorkspaceSessionID: "ws-big"})
	if err != nil {
		require.ErrorAs(t, err, &ae)
		require.Equal(t, api.KindResourceExhausted, ae.Kind)
	}
	track()
	// Up to date, a refresh copies nothing and says so; once the head
	// moved, it is held to the same cap as a publish.
	rr, err := d.refreshSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-big"})
	require.NoError(t, err)
	require.True(t, rr.UpToDate, "%+v", rr)
	_, err = d.fileWrite(ctx, "r-head", api.FileWriteArgs{Path: "moved.txt", Content: "head moved\n"})
	require.NoError(t, err)
	_, err = d.refreshSession(ctx, api.SessionArgs{WorkspaceSessionID: "ws-big"})
	require.ErrorAs(t, err, &ae)
	require.Equal(t, api.KindResourceExhausted, ae.Kind, "%+v", ae)
	require.Equal(t, "max_publish_bytes", ae.Details["limit"])
	require.Equal(t, StateActive, s.state, "a refused refresh leaves the session active")
	track()
	require.Less(t, peak-before, uint64(64<<20), "the daemon's heap grew by %d MiB over a 3 GiB file", (peak-before)>>20)

	require.NoError(t, os.Remove(big))
	res, err := d.publishPrepare(ctx, step("tx-small", "ws-big"))
	require.NoError(t, err)
	require.False(t, res.Rejected())
}
