package api

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestServerTimingRoundTrips(t *testing.T) {
	st := ServerTiming{{TimingGateway, 12345 * time.Microsecond}, {TimingDaemonRPC, 2 * time.Millisecond}, {TimingDaemon, 90 * time.Microsecond}}
	require.Equal(t, "gateway;dur=12.345, daemon_rpc;dur=2, daemon;dur=0.09", st.String())
	back := ParseServerTiming(st.String())
	require.Equal(t, st, back)
	d, ok := back.Get(TimingDaemon)
	require.True(t, ok)
	require.Equal(t, 90*time.Microsecond, d)
	_, ok = back.Get("db")
	require.False(t, ok)
}

func TestParseServerTimingKeepsOnlyMetricsWithADuration(t *testing.T) {
	got := ParseServerTiming(`cache;desc="Cache Read";dur=23.2, miss, db;dur=NaN, app;dur=-1, big;dur=1e300, x y;dur=1, ;dur=3, total;DUR="4.5";desc=z, cpu;dur=abc, edge;dur=0`)
	require.Equal(t, ServerTiming{{"cache", 23200 * time.Microsecond}, {"total", 4500 * time.Microsecond}, {"edge", 0}}, got)
	require.Empty(t, ParseServerTiming(""))
	require.Empty(t, ParseServerTiming(",,,;;;==="))
}

func FuzzParseServerTiming(f *testing.F) {
	f.Add("daemon;dur=0.09, gateway;dur=1")
	f.Add(`a;dur="1";desc=x,b`)
	f.Fuzz(func(t *testing.T, h string) {
		for _, m := range ParseServerTiming(h) {
			if m.Dur < 0 || m.Dur > 24*time.Hour || !isToken(m.Name) {
				t.Fatalf("%q gave %v", h, m)
			}
		}
	})
}
