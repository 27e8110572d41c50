package daemonclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// The calls made with a WithTimings context add up: their round trips and
// the daemon's own time as each answer's Server-Timing says (a garbled or
// missing header counts the call with no daemon time).
func TestTimingsSumTheCallsOfAContext(t *testing.T) {
	headers := []string{"daemon;dur=1.5", "db;dur=7, daemon;dur=0.25", "daemon;dur=abc", ""}
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := headers[n%len(headers)]; h != "" {
			w.Header().Set(api.ServerTimingHeader, h)
		}
		n++
		time.Sleep(2 * time.Millisecond)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	c := New([]byte("s"), nil)

	// Without WithTimings nothing is recorded, and nothing breaks.
	_, _, err := c.Do(context.Background(), Call{SandboxID: "sb", Endpoint: endpointOf(t, srv), Op: "file_read"})
	require.NoError(t, err)
	n = 0

	ctx, tm := WithTimings(context.Background())
	require.Nil(t, tm.ServerTiming(), "no call: no entries")
	for range headers {
		_, _, err := c.Do(ctx, Call{SandboxID: "sb", Endpoint: endpointOf(t, srv), Op: "file_read"})
		require.NoError(t, err)
	}
	st := tm.ServerTiming()
	require.Len(t, st, 2)
	rpc, ok := st.Get(api.TimingDaemonRPC)
	require.True(t, ok)
	require.GreaterOrEqual(t, rpc, 8*time.Millisecond, "four round trips of at least 2 ms")
	d, ok := st.Get(api.TimingDaemon)
	require.True(t, ok)
	require.Equal(t, 1750*time.Microsecond, d)
	require.Equal(t, "daemon_rpc", st[0].Name)
}
