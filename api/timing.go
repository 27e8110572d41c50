package api

import (
	"strconv"
	"strings"
	"time"
)

// ServerTimingHeader is the HTTP header (W3C Server Timing) in which the
// daemon says how long it took over a request and the gateway how long it
// took in all and how much of that was its calls to the daemon.
const ServerTimingHeader = "Server-Timing"

// The metric names of the Server-Timing header.
const (
	// TimingDaemon is the daemon's own time: from reading the request to
	// its answer (a streamed answer: to its start). The gateway sums it
	// over the daemon calls of one request.
	TimingDaemon = "daemon"
	// TimingDaemonRPC is the gateway's time in its daemon calls, from
	// sending each to reading its answer's head: the daemon's time plus
	// the way there and back (connection, both processes' scheduling).
	TimingDaemonRPC = "daemon_rpc"
	// TimingGateway is the gateway's whole time over the request, from
	// its routing to the answer.
	TimingGateway = "gateway"
)

// Timing is one metric of a Server-Timing header.
type Timing struct {
	Name string
	Dur  time.Duration
}

// ServerTiming is a Server-Timing header's metrics, in their order.
type ServerTiming []Timing

// String is the header's value: "name;dur=<ms>" entries joined by ", ",
// durations in milliseconds to the microsecond.
func (t ServerTiming) String() string {
	var b strings.Builder
	for i, m := range t {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.Name)
		b.WriteString(";dur=")
		b.WriteString(strconv.FormatFloat(float64(m.Dur.Microseconds())/1000, 'f', -1, 64))
	}
	return b.String()
}

// Get is the duration of metric name, and whether the header has it with
// a duration.
func (t ServerTiming) Get(name string) (time.Duration, bool) {
	for _, m := range t {
		if m.Name == name {
			return m.Dur, true
		}
	}
	return 0, false
}

// ParseServerTiming reads a Server-Timing header's metrics that carry a
// duration. It never fails: what is not a metric with a finite,
// non-negative dur (another server's syntax, a stranger's garbage) is left
// out, and so are names that are not tokens.
func ParseServerTiming(h string) ServerTiming {
	var out ServerTiming
	for _, entry := range strings.Split(h, ",") {
		parts := strings.Split(entry, ";")
		name := strings.TrimSpace(parts[0])
		if !isToken(name) {
			continue
		}
		for _, p := range parts[1:] {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(k), "dur") {
				continue
			}
			ms, err := strconv.ParseFloat(strings.Trim(strings.TrimSpace(v), `"`), 64)
			if err == nil && ms >= 0 && ms <= maxTimingMs { // NaN is neither
				out = append(out, Timing{Name: name, Dur: time.Duration(ms * float64(time.Millisecond))})
			}
			break
		}
	}
	return out
}

// maxTimingMs bounds a duration ParseServerTiming accepts (a day).
const maxTimingMs = float64(24 * time.Hour / time.Millisecond)

// isToken is whether s is an HTTP token (RFC 9110), the syntax of a
// metric's name.
func isToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
