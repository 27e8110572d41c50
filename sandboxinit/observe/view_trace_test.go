package observe

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEventsPollerContract follows what the gateway's SSE poller
// (gateway/stream.go streamEvents) does: first last_n, then since_ms =
// the newest ts it saw. Every event arrives exactly once; each batch is
// newest first, so the poller reverses it to stream in time order.
func TestEventsPollerContract(t *testing.T) {
	o := newObserver(t)
	fetch := func(args EventsArgs) []map[string]any {
		res, err := o.EventsView(args)
		require.NoError(t, err)
		var evs []map[string]any
		for _, e := range asJSON(t, res)["events"].([]any) {
			evs = append(evs, e.(map[string]any))
		}
		return evs
	}
	emit := func(from, n int) {
		// A new batch starts in a later millisecond than the poller's
		// since: since_ms has millisecond resolution, so an event in the
		// same millisecond as the newest one a poll saw is never returned.
		last := time.Now().UnixMilli()
		require.Eventually(t, func() bool { return time.Now().UnixMilli() > last }, time.Second, 100*time.Microsecond)
		for i := from; i < from+n; i++ {
			o.Store.Tracer.Event(context.Background(), "test.event", map[string]any{"i": i})
		}
	}
	emit(0, 30)
	var got []int
	var since int64
	take := func(evs []map[string]any) {
		for i := len(evs) - 1; i >= 0; i-- { // oldest first
			ts, err := time.Parse(time.RFC3339Nano, evs[i]["ts"].(string))
			require.NoError(t, err)
			since = max(since, ts.UnixMilli())
			got = append(got, int(evs[i]["attrs"].(map[string]any)["i"].(float64)))
		}
	}
	take(fetch(EventsArgs{LastN: 50}))
	for round := 1; round <= 5; round++ {
		emit(30*round, 30)
		take(fetch(EventsArgs{SinceMS: since}))
	}
	take(fetch(EventsArgs{SinceMS: since}))
	want := make([]int, 180)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, got, "each event once, in time order after reversing each batch")
}
