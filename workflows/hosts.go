package workflows

import (
	"time"

	"go.temporal.io/sdk/workflow"
)

// The host registry: one long-running workflow that every sandbox-worker
// with an advertised address signals every HostBeatInterval (signal with
// start, so the first worker creates it). The gateway queries it to place
// new sandboxes (--host, or the least-loaded live host), to route
// host-scoped reads, and to reach a sandbox's daemon on another host
// through that host's forwarder (hostlink).
const (
	HostRegistryWorkflowName = "eos.HostRegistryWorkflow"
	HostRegistryWorkflowID   = "eos-hosts"
	SignalHostBeat           = "host_beat"
	QueryHosts               = "hosts"
	// HostBeatInterval is how often a worker signals; a host not heard
	// from for HostStaleAfter is lost (its sandboxes unavailable).
	HostBeatInterval = 3 * time.Second
	HostStaleAfter   = 4 * HostBeatInterval
)

// hostRegistryRun bounds one run's history: after that many beats the
// registry continues as new with the hosts it knows (a var for tests).
var hostRegistryRun = 1000

// HostBeat is what a worker tells the registry about its host.
type HostBeat struct {
	Name  string `json:"name"`  // the host's name (--host-name; default the hostname)
	Queue string `json:"queue"` // its activity task queue
	// Advertise is the forwarder's host:port; Fingerprint the SHA-256 of
	// its TLS certificate (hex), which the gateway pins.
	Advertise   string `json:"advertise"`
	Fingerprint string `json:"fingerprint"`
	Sandboxes   int    `json:"sandboxes"` // sandbox containers of this deployment on the host
	// Leaving: the worker is stopping; the host is lost at once.
	Leaving bool `json:"leaving,omitempty"`
}

// HostInfo is a registered host as the registry last heard of it.
type HostInfo struct {
	HostBeat
	LastSeen time.Time `json:"last_seen"`
}

// Live reports whether the host was heard from within HostStaleAfter of
// now and did not say it was leaving.
func (h HostInfo) Live(now time.Time) bool {
	return !h.Leaving && now.Sub(h.LastSeen) < HostStaleAfter
}

// HostRegistryWorkflow keeps the last beat of every host (query "hosts",
// sorted by name). Its state is only the map; the beat's time is the
// workflow's (the server's) clock at the signal.
func HostRegistryWorkflow(ctx workflow.Context, known []HostInfo) error {
	hosts := map[string]HostInfo{}
	for _, h := range known {
		hosts[h.Name] = h
	}
	if err := workflow.SetQueryHandler(ctx, QueryHosts, func() ([]HostInfo, error) {
		return sortedHosts(hosts), nil
	}); err != nil {
		return err
	}
	ch := workflow.GetSignalChannel(ctx, SignalHostBeat)
	for n := 0; n < hostRegistryRun; n++ {
		var b HostBeat
		ch.Receive(ctx, &b)
		if b.Name == "" || b.Queue == "" {
			continue
		}
		hosts[b.Name] = HostInfo{HostBeat: b, LastSeen: workflow.Now(ctx)}
	}
	// Drain what arrived meanwhile, then carry the hosts into the next run.
	for {
		var b HostBeat
		if !ch.ReceiveAsync(&b) {
			break
		}
		if b.Name != "" && b.Queue != "" {
			hosts[b.Name] = HostInfo{HostBeat: b, LastSeen: workflow.Now(ctx)}
		}
	}
	return workflow.NewContinueAsNewError(ctx, HostRegistryWorkflowName, sortedHosts(hosts))
}

// sortedHosts lists the hosts by name (never in map order).
func sortedHosts(hosts map[string]HostInfo) []HostInfo {
	out := make([]HostInfo, 0, len(hosts))
	for _, name := range workflow.DeterministicKeys(hosts) {
		out = append(out, hosts[name])
	}
	return out
}
