package daemonclient

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Timings sums the daemon calls made with a context from WithTimings:
// their round trips (sending each to reading its answer's head) and the
// daemon's own time as its Server-Timing header says. It is safe for
// concurrent calls.
type Timings struct {
	mu     sync.Mutex
	calls  int
	rpc    time.Duration
	daemon time.Duration
}

type timingsKey struct{}

// WithTimings returns a context whose daemon calls add up in the Timings
// it returns.
func WithTimings(ctx context.Context) (context.Context, *Timings) {
	t := &Timings{}
	return context.WithValue(ctx, timingsKey{}, t), t
}

// ServerTiming is the calls' entries of a Server-Timing header:
// daemon_rpc and daemon, summed over the calls; none when there was no
// call (the daemon entry also when no answer carried one).
func (t *Timings) ServerTiming() api.ServerTiming {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.calls == 0 {
		return nil
	}
	return api.ServerTiming{{Name: api.TimingDaemonRPC, Dur: t.rpc}, {Name: api.TimingDaemon, Dur: t.daemon}}
}

// record adds one call of req that took rpc and was answered with h.
func record(req *http.Request, rpc time.Duration, h http.Header) {
	t, _ := req.Context().Value(timingsKey{}).(*Timings)
	if t == nil {
		return
	}
	d, _ := api.ParseServerTiming(h.Get(api.ServerTimingHeader)).Get(api.TimingDaemon)
	t.mu.Lock()
	t.calls++
	t.rpc += rpc
	t.daemon += d
	t.mu.Unlock()
}
