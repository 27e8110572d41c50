package gateway

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// endpoint is where the sandbox's daemon listens, from the cache or the
// sandbox workflow's state (its copy while current, as the views read it:
// a busy sandbox's first call after a gateway restart does not wait on
// the query).
func (b *TemporalBackend) endpoint(ctx context.Context, id string) (api.Endpoint, error) {
	b.mu.Lock()
	ep, ok := b.endpoints[id]
	b.mu.Unlock()
	if ok {
		return ep, nil
	}
	st, _, err := b.viewState(ctx, id)
	if err != nil {
		return ep, err
	}
	if workflows.IsPausedPhase(st.Phase) {
		return ep, workflows.PausedError(id, st.Phase)
	}
	if st.Phase != workflows.PhaseReady || st.Container.Daemon.Port == 0 {
		return ep, api.Errorf(api.KindInvalidRequest, map[string]any{"sandbox_id": id, "state": st.Phase}, "sandbox %s is %s", id, st.Phase)
	}
	b.rememberContainer(id, st.Container)
	return st.Container.Daemon, nil
}

// resolveDaemon is the daemon client's Resolver: after a refused
// connection (a restarted container listens on another host port, or a
// restarted gateway's cache is stale) the sandbox workflow asks the host's
// worker where Docker publishes the daemon now and records it, so the
// sandbox record shows the current endpoint too.
func (b *TemporalBackend) resolveDaemon(ctx context.Context, id string) (api.Endpoint, error) {
	if _, err := b.via(ctx, id); err != nil {
		return api.Endpoint{}, err // its host is lost: nothing there can answer
	}
	var info workflows.ContainerInfo
	if err := b.update(ctx, id, workflows.UpdateResolveDaemon, &info); err != nil {
		return api.Endpoint{}, err
	}
	b.rememberContainer(id, info)
	return info.Daemon, nil
}

// Runtime implements Backend: the op goes straight to the daemon.
func (b *TemporalBackend) Runtime(ctx context.Context, op, sandboxID string, args map[string]any) (any, error) {
	return b.RuntimeProgress(ctx, op, sandboxID, args, nil)
}

// RuntimeProgress implements RuntimeProgressBackend: with progress, the
// daemon streams the command's output lines (stderr ones prefixed
// "[stderr] ") while the call waits.
func (b *TemporalBackend) RuntimeProgress(ctx context.Context, op, sandboxID string, args map[string]any, progress func(string)) (any, error) {
	if sandboxID == "" {
		switch op {
		case "snapshot":
			return b.fleetSnapshot(ctx)
		case "resources":
			return b.fleetResources(ctx)
		}
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"op": op}, "%s needs a sandbox id", op)
	}
	if op == "snapshot" {
		return b.sandboxSnapshot(ctx, sandboxID, args)
	}
	if o, ok := api.LookupOp(op); ok && o.Group == api.GroupObservability {
		// The daemon's views name their sandbox; it does not know its id.
		args = withArg(args, "sandbox_id", sandboxID)
	}
	body, err := json.Marshal(args)
	if err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "args: %v", err)
	}
	ep, err := b.endpoint(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	var lines func(api.OutputLine)
	if progress != nil {
		lines = func(l api.OutputLine) {
			if l.Stream == "stderr" {
				progress("[stderr] " + l.Text)
			} else {
				progress(l.Text)
			}
		}
	}
	return b.callDaemon(ctx, sandboxID, ep, op, body, lines)
}

// callDaemon runs one daemon RPC; a daemon that cannot be reached is an
// internal_error naming the sandbox (never the transport's text alone).
func (b *TemporalBackend) callDaemon(ctx context.Context, sandboxID string, ep api.Endpoint, op string, body []byte, lines func(api.OutputLine)) (json.RawMessage, error) {
	via, err := b.via(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	out, used, err := b.daemons().Do(ctx, daemonclient.Call{SandboxID: sandboxID, Endpoint: ep, Direct: b.directFor(sandboxID, ep), Op: op, Args: body,
		RequestID: RequestID(ctx), Progress: lines, Via: via})
	if used != ep && err == nil {
		b.remember(sandboxID, used)
	}
	if err == nil {
		return out, nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return nil, ae
	}
	if daemonclient.IsConn(err) {
		return nil, api.Errorf(api.KindInternal, map[string]any{"sandbox_id": sandboxID, "availability": "unavailable"},
			"the daemon of sandbox %s cannot be reached: it may be restarting; retry in a moment", sandboxID)
	}
	return nil, api.Errorf(api.KindInternal, map[string]any{"sandbox_id": sandboxID}, "daemon of %s: %v", sandboxID, err)
}
