package gateway

import (
	"context"
	"errors"
	"regexp"
	"sort"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/hostdir"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// The Docker hosts of a cluster, as their workers' heartbeats describe
// them (workflows.HostRegistryWorkflow): where new sandboxes go, where a
// host-scoped read runs, and through which forwarder a sandbox's daemon on
// another host is reached. A sandbox on a queue no host registered is on
// this machine (a single-machine deployment): its daemon is dialled
// directly, as always.

var hostNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// hosts is the registry's list (cached briefly: hostdir.Directory); no
// registry yet is none.
func (b *TemporalBackend) hosts(ctx context.Context) ([]workflows.HostInfo, error) {
	return b.hostDir.Hosts(ctx, b.Client)
}

// cachedHost is the host of queue from the last registry answer, without
// asking (records, rendered without a context).
func (b *TemporalBackend) cachedHost(queue string) (workflows.HostInfo, bool) {
	return b.hostDir.Cached(queue)
}

// isLocalQueue: the sandbox's activities run on this process's own
// workers, so its daemon is on this machine.
func (b *TemporalBackend) isLocalQueue(q string) bool {
	return q == "" || (b.LocalQueue != "" && q == b.LocalQueue)
}

func hostLost(id string, h workflows.HostInfo) *api.Error {
	why := "has not been heard from since " + h.LastSeen.UTC().Format(time.RFC3339)
	if h.Leaving {
		why = "stopped its worker at " + h.LastSeen.UTC().Format(time.RFC3339)
	}
	d := map[string]any{"host": h.Name, "availability": "unavailable", "last_seen": h.LastSeen.UTC().Format(time.RFC3339Nano)}
	if id != "" {
		d["sandbox_id"] = id
	}
	return api.Errorf(api.KindOperationFailed, d,
		"host %s of sandbox %s is unavailable: it %s (its work is kept; it is served again when its sandbox-worker is back)", h.Name, id, why)
}

// queueOf is the task queue of a sandbox's host (from the cache, else its
// workflow's state).
func (b *TemporalBackend) queueOf(ctx context.Context, id string) (string, error) {
	b.mu.Lock()
	q, ok := b.queues[id]
	b.mu.Unlock()
	if ok || b.Client == nil { // no Temporal (unit tests): every sandbox is local
		return q, nil
	}
	st, _, err := b.viewState(ctx, id)
	if err != nil {
		return "", err
	}
	return st.HostQueue, nil
}

func (b *TemporalBackend) rememberQueue(id, q string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.queues == nil {
		b.queues = map[string]string{}
	}
	b.queues[id] = q
}

// via is how the gateway reaches a sandbox's daemon: nil = directly (its
// host is this machine), else its host's forwarder. A host that
// registered but is not live makes the sandbox unavailable, at once.
func (b *TemporalBackend) via(ctx context.Context, id string) (*daemonclient.Via, error) {
	q, err := b.queueOf(ctx, id)
	if err != nil || b.isLocalQueue(q) {
		return nil, err
	}
	h, found, err := b.hostDir.Host(ctx, b.Client, q)
	if err != nil || !found {
		return nil, err // not a registered host: this machine's
	}
	if !h.Live(time.Now()) {
		return nil, hostLost(id, h)
	}
	return hostdir.Via(h), nil
}

// checkHost refuses at once an operation on a sandbox whose host is lost
// (its activities would wait for a worker that is not there). Only a
// gateway without workers of its own has remote hosts.
func (b *TemporalBackend) checkHost(ctx context.Context, id string) error {
	if b.LocalQueue != "" {
		return nil
	}
	_, err := b.via(ctx, id)
	var ae *api.Error
	if errors.As(err, &ae) && ae.Details["availability"] == "unavailable" {
		return ae
	}
	return nil // anything else is for the operation itself to report
}

// hostWatch is how often an operation waiting on a remote host checks
// that the host is still live.
const hostWatch = time.Second

// whileHostLive runs fn, and returns the host's unavailable error as soon
// as the sandbox's host is lost while fn waits (its worker died after the
// operation was accepted: its activities would wait for that worker for
// as long as their timeouts allow). What fn started is not abandoned: a
// durable operation finishes when the host is back. Only a gateway
// without workers of its own has remote hosts; for the others fn just
// runs.
func (b *TemporalBackend) whileHostLive(ctx context.Context, id string, fn func(context.Context) error) error {
	if b.LocalQueue != "" || b.Client == nil {
		return fn(ctx)
	}
	v, err := b.via(ctx, id)
	var ae *api.Error
	switch {
	case errors.As(err, &ae) && ae.Details["availability"] == "unavailable":
		return ae // lost before anything was sent
	case err == nil && v == nil:
		return fn(ctx) // this machine's
	}
	// Watched even when the host could not be looked up just now (the
	// registry slow to answer while a host's worker has just died): fn
	// unwatched would wait out its own timeout on a host that is gone.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t := time.NewTicker(hostWatch)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			if err := b.checkHost(ctx, id); err != nil {
				return errHostLost{err}
			}
		}
	}
}

// errHostLost is whileHostLive's answer when it gave up on fn.
type errHostLost struct{ error }

func (e errHostLost) Unwrap() error { return e.error }

// inFlight says of a lost host's error that the durable operation it
// interrupted goes on.
func inFlight(err error) error {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return err
	}
	e := *ae
	e.Details = withArg(ae.Details, "in_flight", true)
	e.Message += "; the operation was accepted and finishes when the host is back (the same request id then joins it and gets its answer)"
	return &e
}

// place is the queue a new sandbox (or a host-scoped read) goes to: the
// named host, else this process's own workers, else the live host with
// the fewest sandboxes (reserve: a sandbox goes there, counted until the
// host's next beat does). With no registered host it is the configured
// HostQueue, as before hosts registered.
func (b *TemporalBackend) place(ctx context.Context, name string, reserve bool) (string, error) {
	if name == "" && b.LocalQueue != "" {
		return b.HostQueue, nil
	}
	if name != "" && !hostNamePattern.MatchString(name) {
		return "", api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "host"}, "invalid host name %q", name)
	}
	hosts, err := b.hosts(ctx)
	if err != nil {
		return "", err
	}
	now := time.Now()
	var live []workflows.HostInfo
	names := []string{}
	for _, h := range hosts {
		names = append(names, h.Name)
		if name != "" && h.Name == name {
			if !h.Live(now) {
				return "", hostLost("", h)
			}
			return h.Queue, nil
		}
		if h.Live(now) {
			live = append(live, h)
		}
	}
	if name != "" {
		if b.LocalQueue != "" && (name == b.LocalName || "eos-host-"+name == b.LocalQueue) {
			return b.LocalQueue, nil
		}
		return "", api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "host", "hosts": names}, "unknown host %q", name)
	}
	if len(live) == 0 {
		if len(hosts) > 0 {
			return "", api.Errorf(api.KindOperationFailed, map[string]any{"hosts": names, "availability": "unavailable"},
				"no Docker host is available: none of %v has a live sandbox-worker", names)
		}
		return b.HostQueue, nil
	}
	// Least loaded: the beat's count plus what this gateway placed since
	// that beat, less this gateway's standbys there (no one's load yet).
	held := b.pool().perQueue()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.placed == nil {
		b.placed = map[string][]time.Time{}
	}
	load := func(h workflows.HostInfo) int {
		n := h.Sandboxes - held[h.Queue]
		for _, t := range b.placed[h.Queue] {
			if t.After(h.LastSeen) {
				n++
			}
		}
		return n
	}
	sort.SliceStable(live, func(i, j int) bool { return load(live[i]) < load(live[j]) })
	q := live[0].Queue
	if !reserve {
		return q, nil
	}
	kept := b.placed[q][:0]
	for _, t := range b.placed[q] {
		if now.Sub(t) < time.Minute {
			kept = append(kept, t)
		}
	}
	b.placed[q] = append(kept, now)
	return q, nil
}
