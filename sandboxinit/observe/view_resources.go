package observe

import (
	"bytes"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// WindowArgs are the resources view's arguments.
type WindowArgs struct {
	WindowMS  int64  `json:"window_ms,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// CgroupArgs are the cgroup view's arguments.
type CgroupArgs struct {
	Scope     string `json:"scope,omitempty"` // "sandbox" (default) or a workspace session id
	WindowMS  int64  `json:"window_ms,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// resourcesView returns every scope's samples of the window, oldest first.
func (o *Observer) ResourcesView(a WindowArgs) map[string]any {
	window := windowOr(a.WindowMS, 60000)
	errs := []viewError{}
	series, err := o.samplesSince(telemetry.Query{}, window)
	if err != nil {
		errs = append(errs, viewError{"samples", err.Error()})
	}
	// latest: the newest sandbox sample of the window (what the gateway's
	// fleet view shows without Docker), null if none.
	var latest any
	for i := len(series) - 1; i >= 0; i-- {
		if bytes.Contains(series[i], []byte(`"scope":"sandbox"`)) {
			latest = series[i]
			break
		}
	}
	availability := "available"
	if len(errs) > 0 {
		availability = "partial"
	}
	return map[string]any{"view": "resources", "scope": "sandbox", "sandbox_id": o.sandboxID(a.SandboxID), "source": "daemon_disk",
		"availability": availability, "errors": errs, "series": series, "latest": latest, "window_ms": window,
		"sampler": o.Sampler.Stats()}
}

// cgroupView returns one scope's samples and the process topology: the
// sandbox (its container's cgroup as the daemon samples it; the gateway
// may answer this scope from Docker instead) or one workspace session.
func (o *Observer) CgroupView(a CgroupArgs) (map[string]any, error) {
	scope := a.Scope
	if scope == "" {
		scope = "sandbox"
	}
	only := ""
	if scope != "sandbox" {
		if _, err := o.src.Session(scope); err != nil {
			return nil, api.Errorf(api.KindNotFound, map[string]any{"scope": scope}, "cgroup scope %q: not sandbox and not a live workspace session", scope)
		}
		only = scope
	}
	series, err := o.samplesSince(telemetry.Query{Scope: scope}, windowOr(a.WindowMS, 60000))
	if err != nil {
		return nil, err
	}
	return map[string]any{"view": "cgroup", "scope": scope, "source": "daemon_disk", "series": series, "topology": o.topology(only)}, nil
}

func (o *Observer) TopologyView() map[string]any {
	return map[string]any{"view": "topology", "scope": "sandbox", "topology": o.topology("")}
}
