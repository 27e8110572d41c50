package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// lifecycleArgs reads create_sandbox's ttl and session_idle_ttl (Go
// durations; absent: the gateway's defaults), refusing a bad one before
// any workflow starts.
func (b *TemporalBackend) lifecycleArgs(args map[string]any) (ttl, idle time.Duration, err error) {
	ttl, idle = b.DefaultSandboxTTL, b.DefaultSessionIdleTTL
	for _, a := range []struct {
		name string
		out  *time.Duration
	}{{"ttl", &ttl}, {"session_idle_ttl", &idle}} {
		v, ok := args[a.name]
		if !ok || v == nil {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return 0, 0, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": a.name}, "%s must be a duration string such as 30m or 24h", a.name)
		}
		d, perr := api.ParseTTL(a.name, s)
		if perr != nil {
			return 0, 0, perr
		}
		*a.out = d
	}
	return ttl, idle, nil
}

// addLifecycle puts the sandbox's TTLs and pause state into its record.
func addLifecycle(rec map[string]any, st *workflows.SandboxState) {
	lc := st.Lifecycle
	if lc == nil {
		return
	}
	rec["lifecycle"] = lifecycleView(st)
	if workflows.IsPausedPhase(st.Phase) {
		rec["daemon"], rec["daemon_http"] = nil, nil // it does not listen while paused
	}
}

// lifecycleView is the lifecycle part of inspect_sandbox and snapshot.
func lifecycleView(st *workflows.SandboxState) map[string]any {
	lc := st.Lifecycle
	if lc == nil {
		return nil
	}
	v := map[string]any{"state": st.Phase, "paused": workflows.IsPausedPhase(st.Phase),
		"ttl": durationString(lc.TTL), "session_idle_ttl": durationString(lc.SessionIdleTTL), "pauses": lc.Pauses}
	if lc.ExpiresAt != nil && st.Phase == workflows.PhaseReady {
		v["expires_at"] = lc.ExpiresAt.UTC().Format(time.RFC3339)
	}
	if lc.PausedAt != nil {
		v["paused_at"], v["paused_by"] = lc.PausedAt.UTC().Format(time.RFC3339), lc.PausedBy
	}
	if lc.TTLPostponed > 0 {
		v["ttl_postponed"] = lc.TTLPostponed
	}
	if lc.ResumedAt != nil {
		v["resumed_at"] = lc.ResumedAt.UTC().Format(time.RFC3339)
	}
	return v
}

func durationString(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// sandboxSnapshot is the sandbox form of the snapshot view: the daemon's
// snapshot with the lifecycle added; a paused sandbox (no daemon) answers
// its lifecycle alone, availability "paused".
func (b *TemporalBackend) sandboxSnapshot(ctx context.Context, sandboxID string, args map[string]any) (any, error) {
	st, _, err := b.viewState(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	if st.Phase == workflows.PhaseStopped {
		return nil, notFoundSandbox(sandboxID)
	}
	if st.Phase != workflows.PhaseReady || st.Container.Daemon.Port == 0 {
		node := unavailable(sandboxID, st.Phase, fmt.Errorf("sandbox %s is %s", sandboxID, st.Phase))
		if workflows.IsPausedPhase(st.Phase) {
			node["availability"] = "paused"
			node["errors"] = []any{map[string]any{"kind": api.KindFailedPrecondition, "message": workflows.PausedError(sandboxID, st.Phase).Message}}
		}
		node["lifecycle"] = lifecycleView(st)
		node["publish_queue"] = publishQueue(st)
		return node, nil
	}
	body, err := json.Marshal(withArg(args, "sandbox_id", sandboxID))
	if err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "args: %v", err)
	}
	ep, err := b.endpoint(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	raw, err := b.callDaemon(ctx, sandboxID, ep, "snapshot", body, nil)
	if err != nil {
		return nil, err
	}
	var node map[string]any
	if err := json.Unmarshal(raw, &node); err != nil {
		return nil, api.Errorf(api.KindInternal, nil, "decode snapshot: %v", err)
	}
	if lv := lifecycleView(st); lv != nil {
		node["lifecycle"] = lv
	}
	node["publish_queue"] = publishQueue(st)
	return node, nil
}

// publishQueue is the workflow's queue of verified publishes waiting or
// running, in order (never null).
func publishQueue(st *workflows.SandboxState) []*workflows.QueuedPublish {
	if st.PublishQueue == nil {
		return []*workflows.QueuedPublish{}
	}
	return st.PublishQueue
}
