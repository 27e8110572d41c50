package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Metrics are the gateway's Prometheus metrics, served at /metrics:
// operations by name and outcome with latency histograms; publishes by
// kind and outcome (merges and conflicts among them); live sandboxes and
// sessions; the latency of every Temporal RPC this process makes.
type Metrics struct {
	Registry *prometheus.Registry

	ops      *prometheus.CounterVec
	opTime   *prometheus.HistogramVec
	publish  *prometheus.CounterVec
	temporal *prometheus.HistogramVec
	views    *prometheus.CounterVec
	fleet    *fleetCollector

	// counted remembers the commands whose implicit publish was counted
	// (their terminal answer can be read many times), bounded.
	mu      sync.Mutex
	counted map[string]bool
	order   []string
}

const maxCountedCommands = 4096

// latencyBuckets span a cached file read (sub-millisecond) to a sandbox
// create of a large repository (tens of seconds).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// NewMetrics builds the gateway's metrics on a fresh registry (with the Go
// runtime and process collectors).
func NewMetrics() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.ops = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "eos", Name: "operations_total",
		Help: "Operations served, by name and outcome (ok or the error kind)."}, []string{"op", "outcome"})
	m.opTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "eos", Name: "operation_duration_seconds",
		Help: "Latency of operations, by name and outcome.", Buckets: latencyBuckets}, []string{"op", "outcome"})
	m.publish = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "eos", Name: "publishes_total",
		Help: "Publishes by kind (session, implicit: a command without a session) and outcome (clean, merged, no_op, conflict, failed)."},
		[]string{"kind", "outcome"})
	m.temporal = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "eos", Name: "temporal_request_duration_seconds",
		Help: "Round-trip latency of Temporal RPCs made by this process (long polls excluded), by method.", Buckets: latencyBuckets},
		[]string{"method", "code"})
	m.views = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "eos", Name: "sandbox_view_reads_total",
		Help: "Reads of a sandbox's state for a view (inspect_sandbox, snapshot, the fleet; and where its daemon is, on a cache miss), by source: copy (the sandbox workflow's copy in this process, current), " +
			"copy_after_wait (the same, once the workflow task in flight made it current), host_copy and host_copy_after_wait (the same, from the cluster host whose worker runs the workflow, through its forwarder), " +
			"query (the workflow's state query)."}, []string{"source"})
	m.fleet = &fleetCollector{
		sandboxes: prometheus.NewDesc("eos_sandboxes", "Sandboxes by lifecycle state.", []string{"state"}, nil),
		sessions:  prometheus.NewDesc("eos_workspace_sessions", "Live workspace sessions over all sandboxes.", nil, nil),
		up:        prometheus.NewDesc("eos_fleet_scrape_ok", "1 if the fleet could be listed at the last scrape.", nil, nil),
	}
	m.Registry.MustRegister(m.ops, m.opTime, m.publish, m.temporal, m.views, m.fleet,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observe records one finished operation and, for publishes, its outcome.
func (m *Metrics) observe(op string, d time.Duration, out json.RawMessage, aerr *api.Error) {
	outcome := "ok"
	if aerr != nil {
		outcome = aerr.Kind
	}
	m.ops.WithLabelValues(op, outcome).Inc()
	m.opTime.WithLabelValues(op, outcome).Observe(d.Seconds())
	switch op {
	case "publish_workspace_session":
		// An async publish answers when it is accepted: its outcome is not
		// known here (it shows in publish_history and the workflows view).
		if aerr != nil || json.Valid(out) && strings.Contains(string(out), `"publish"`) {
			m.publish.WithLabelValues("session", publishOutcomeLabel(out, aerr)).Inc()
		}
	case "exec_command", "write_command_stdin", "read_command_lines", "cancel_command":
		// An implicit session's publish rides on its command's terminal
		// answer, which can be read many times: count it once per command.
		if aerr == nil {
			if id, o := implicitPublishOutcome(out); o != "" && m.firstTime(id) {
				m.publish.WithLabelValues("implicit", o).Inc()
			}
		}
	}
}

func (m *Metrics) firstTime(commandID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.counted == nil {
		m.counted = map[string]bool{}
	}
	if m.counted[commandID] {
		return false
	}
	m.counted[commandID] = true
	m.order = append(m.order, commandID)
	if len(m.order) > maxCountedCommands {
		delete(m.counted, m.order[0])
		m.order = m.order[1:]
	}
	return true
}

func publishOutcomeLabel(out json.RawMessage, aerr *api.Error) string {
	if aerr != nil {
		if _, ok := aerr.Details["conflicts"]; ok {
			return "conflict"
		}
		return "failed"
	}
	var r struct {
		Publish struct {
			NoOp        bool     `json:"no_op"`
			MergedPaths []string `json:"merged_paths"`
		} `json:"publish"`
	}
	_ = json.Unmarshal(out, &r)
	switch {
	case r.Publish.NoOp:
		return "no_op"
	case len(r.Publish.MergedPaths) > 0:
		return "merged"
	}
	return "clean"
}

// implicitPublishOutcome reads the publish outcome an implicit session's
// command carries on its terminal answer ("" when it carries none).
func implicitPublishOutcome(out json.RawMessage) (commandID, outcome string) {
	var r struct {
		ID        string           `json:"command_session_id"`
		Rejected  *bool            `json:"publish_rejected"`
		Conflicts []map[string]any `json:"publish_conflicts"`
		Publish   json.RawMessage  `json:"publish"`
	}
	// A clean publish carries only publish (no publish_rejected key, the
	// seed's contract); older daemons also said publish_rejected false.
	if json.Unmarshal(out, &r) != nil || (r.Rejected == nil && len(r.Publish) == 0) {
		return "", ""
	}
	if r.Rejected != nil && *r.Rejected {
		if len(r.Conflicts) > 0 {
			return r.ID, "conflict"
		}
		return r.ID, "failed"
	}
	b, _ := json.Marshal(map[string]json.RawMessage{"publish": r.Publish})
	return r.ID, publishOutcomeLabel(b, nil)
}

// TemporalInterceptor measures every unary Temporal RPC of the client it
// is dialled into (long polls excluded: they wait for work by design).
func (m *Metrics) TemporalInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		name := method[strings.LastIndexByte(method, '/')+1:]
		if strings.HasPrefix(name, "Poll") {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		code := "ok"
		if err != nil {
			code = "error"
		}
		m.temporal.WithLabelValues(name, code).Observe(time.Since(start).Seconds())
		return err
	}
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// FleetLister counts sandboxes by state and their live sessions.
type FleetLister interface {
	FleetCounts(ctx context.Context) (byState map[string]int, sessions int, err error)
}

// fleetCollector reads the fleet at scrape time, at most every 5 s (a
// scrape lists the sandbox workflows and queries each).
type fleetCollector struct {
	sandboxes, sessions, up *prometheus.Desc

	mu      sync.Mutex
	lister  FleetLister
	at      time.Time
	byState map[string]int
	nSess   int
	ok      bool
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sandboxes
	ch <- c.sessions
	ch <- c.up
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lister == nil {
		return
	}
	if time.Since(c.at) > 5*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		byState, n, err := c.lister.FleetCounts(ctx)
		cancel()
		c.at, c.ok = time.Now(), err == nil
		if err == nil {
			c.byState, c.nSess = byState, n
		}
	}
	for _, st := range []string{"creating", "ready", "stopping", "stopped", "failed", "unknown"} {
		ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(c.byState[st]), st)
	}
	ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(c.nSess))
	up := 0.0
	if c.ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}

// FleetCounts implements FleetLister.
func (b *TemporalBackend) FleetCounts(ctx context.Context) (map[string]int, int, error) {
	fleet, err := b.fleet(ctx)
	if err != nil {
		return nil, 0, err
	}
	byState, sessions := map[string]int{}, 0
	for _, f := range fleet {
		if f.Err != nil {
			byState["unknown"]++
			continue
		}
		byState[f.State.Phase]++
		sessions += len(f.State.Sessions)
	}
	return byState, sessions, nil
}
