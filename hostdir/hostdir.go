// Package hostdir is the directory of a cluster's Docker hosts as their
// workers' heartbeats describe them (workflows.HostRegistryWorkflow),
// cached briefly: where new sandboxes go, and through which forwarder
// (hostlink) a sandbox's daemon on another host is reached — by a gateway,
// and by a worker whose workflow calls a daemon of another host.
package hostdir

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/converter"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// CacheFor is how long one registry answer is reused; when the registry is
// slow to answer (QueryPatience), one up to StaleServe old serves instead.
const (
	CacheFor      = time.Second
	QueryPatience = time.Second
	StaleServe    = workflows.HostStaleAfter / 2
)

// Querier asks the host registry (a Temporal client).
type Querier interface {
	QueryWorkflow(ctx context.Context, workflowID, runID, queryType string, args ...interface{}) (converter.EncodedValue, error)
}

// Directory caches the registry's answer. The zero value is ready.
type Directory struct {
	mu   sync.Mutex
	list []workflows.HostInfo
	at   time.Time
}

// Seed sets the cached answer as if the registry gave list at at.
func (d *Directory) Seed(list []workflows.HostInfo, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.list, d.at = list, at
}

// Hosts is the registry's list (cached for CacheFor); no registry yet is
// none. The registry's query waits for the worker that last ran its
// workflow; when that worker just died (its host is the one being lost)
// the server tries it for seconds before another takes over. So after
// QueryPatience an answer up to StaleServe old serves (the next call asks
// again): a host is then judged by beats that recent, never by a wait on
// the dead worker. An older one does not: the registry is asked again
// with the caller's own time.
func (d *Directory) Hosts(ctx context.Context, c Querier) ([]workflows.HostInfo, error) {
	d.mu.Lock()
	if time.Since(d.at) < CacheFor {
		h := d.list
		d.mu.Unlock()
		return h, nil
	}
	d.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, QueryPatience)
	v, err := c.QueryWorkflow(qctx, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts)
	// Out of patience: the client's deadline passed, or the server gave
	// up at it first (it answers DeadlineExceeded a moment before the
	// deadline it was sent, while qctx still has time).
	var server *serviceerror.DeadlineExceeded
	impatient := errors.Is(qctx.Err(), context.DeadlineExceeded) || errors.As(err, &server) // read before cancel sets it
	cancel()
	if err != nil && impatient && ctx.Err() == nil {
		d.mu.Lock()
		h, at := d.list, d.at
		d.mu.Unlock()
		if !at.IsZero() && time.Since(at) < StaleServe {
			return h, nil
		}
		v, err = c.QueryWorkflow(ctx, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts)
	}
	var list []workflows.HostInfo
	if err != nil {
		var nf *serviceerror.NotFound
		if !errors.As(err, &nf) {
			return nil, api.Errorf(api.KindOperationFailed, nil, "the host registry does not answer: %v", err)
		}
	} else if err := v.Get(&list); err != nil {
		return nil, api.Errorf(api.KindInternal, nil, "decode host registry: %v", err)
	}
	d.Seed(list, time.Now())
	return list, nil
}

// Cached is the host of queue from the last answer, without asking.
func (d *Directory) Cached(queue string) (workflows.HostInfo, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.list {
		if h.Queue == queue {
			return h, true
		}
	}
	return workflows.HostInfo{}, false
}

// Host is the registered host whose worker serves queue (found false: no
// host registered it, so it is this machine's).
func (d *Directory) Host(ctx context.Context, c Querier, queue string) (workflows.HostInfo, bool, error) {
	hosts, err := d.Hosts(ctx, c)
	if err != nil {
		return workflows.HostInfo{}, false, err
	}
	for _, h := range hosts {
		if h.Queue == queue {
			return h, true, nil
		}
	}
	return workflows.HostInfo{}, false, nil
}

// Via is the forwarder of host h (nil when it advertises none).
func Via(h workflows.HostInfo) *daemonclient.Via {
	if h.Advertise == "" {
		return nil
	}
	return &daemonclient.Via{Addr: h.Advertise, Fingerprint: h.Fingerprint}
}
