package observe

import (
	"encoding/json"
	"path/filepath"
	"sort"
	"time"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// ScopeArgs are the arguments of views without their own: the gateway may
// pass the sandbox's id, which the daemon otherwise only knows from its
// configuration.
type ScopeArgs struct {
	SandboxID string `json:"sandbox_id,omitempty"`
}

// snapshotHistory is how many sandbox samples snapshot.resources.history
// holds (a minute at the default interval).
const snapshotHistory = 30

func (o *Observer) sandboxID(fromArgs string) string {
	if fromArgs != "" {
		return fromArgs
	}
	return o.cfg.SandboxID
}

// viewError is one entry of a view's errors list.
type viewError struct {
	Source  string `json:"source"`
	Message string `json:"message"`
}

// latestSamples returns, from one scan of the last minute of samples, the
// newest sample of every scope and the sandbox's recent history (oldest
// first).
func (o *Observer) latestSamples() (latest map[string]json.RawMessage, history []json.RawMessage, err error) {
	res, err := o.Store.Samples.Query(telemetry.Query{Kind: telemetry.KindSample, Ordered: true, SinceMS: time.Now().UnixMilli() - 60000})
	latest = map[string]json.RawMessage{}
	for i, h := range res.Headers {
		if _, ok := latest[h.Scope]; !ok {
			latest[h.Scope] = res.Records[i]
		}
		if h.Scope == "sandbox" && len(history) < snapshotHistory {
			history = append(history, res.Records[i])
		}
	}
	for i, j := 0, len(history)-1; i < j; i, j = i+1, j-1 {
		history[i], history[j] = history[j], history[i]
	}
	if history == nil {
		history = []json.RawMessage{}
	}
	return latest, history, err
}

// Snapshot is the sandbox at a glance: the daemon, the newest resources,
// every live workspace and the layer stack.
func (o *Observer) Snapshot(a ScopeArgs) map[string]any {
	now := time.Now()
	errs := []viewError{}
	latest, history, err := o.latestSamples()
	if err != nil {
		errs = append(errs, viewError{"resources", err.Error()})
	}
	lifecycle := "creating"
	stack := map[string]any{"layer_count": 0, "layers_bytes": 0, "layers_allocated_bytes": 0, "storage_allocated_bytes": 0,
		"staging_entry_count": 0, "active_leases": 0}
	if man, err := o.src.Layers().Manifest(); err == nil {
		lifecycle = "ready"
		st := o.stackSummary(man)
		for _, e := range st.errors {
			errs = append(errs, viewError{"layerstack", e})
		}
		stack = map[string]any{"layer_count": st.LayerCount, "layers_bytes": st.LayersBytes, "layers_allocated_bytes": st.LayersAllocatedBytes,
			"storage_allocated_bytes": st.StorageAllocatedBytes, "storage_logical_bytes": st.StorageLogicalBytes,
			"staging_entry_count": st.StagingEntryCount, "active_leases": st.ActiveLeases,
			"manifest_version": st.ManifestVersion, "root_hash": st.RootHash}
	}
	sessions := o.src.Sessions()
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].Created.Before(sessions[j].Created) })
	workspaces := make([]map[string]any, 0, len(sessions))
	for _, s := range sessions {
		workspaces = append(workspaces, o.workspaceSnapshot(s, latest[s.ID]))
	}
	availability := "available"
	if len(errs) > 0 {
		availability = "partial"
	}
	var latestSandbox any // null until a sample exists
	if l, ok := latest["sandbox"]; ok {
		latestSandbox = l
	}
	return map[string]any{
		"sandbox_id": o.sandboxID(a.SandboxID), "lifecycle_state": lifecycle, "availability": availability,
		"sampled_at_unix_ms": now.UnixMilli(), "errors": errs,
		"daemon": map[string]any{"daemon_pid": selfPID(), "runtime_dir": filepath.Join(o.cfg.StateDir, "runtime"),
			"event_store": o.eventStore(), "uptime_seconds": int64(time.Since(o.cfg.Started).Seconds())},
		"resources":  map[string]any{"latest": latestSandbox, "history": history},
		"workspaces": workspaces,
		"stack":      stack,
	}
}

func (o *Observer) workspaceSnapshot(s Session, latest json.RawMessage) map[string]any {
	layers := map[string]any{"base_root_hash": "", "layer_count": 0}
	if l, err := o.src.Layers().Lease(s.LeaseID); err == nil {
		layers = map[string]any{"base_root_hash": l.RootHash, "layer_count": len(l.Layers), "manifest_version": l.ManifestVersion}
	}
	nsCount, lifecycle := 0, "inactive"
	if rs := s.Runtime; rs != nil {
		lifecycle = "active"
		if pid, err := rs.InitPid(); err == nil {
			nsCount = ownNamespaces(pid)
		}
	}
	execs := []map[string]any{}
	for _, x := range o.Running.List(s.ID) {
		execs = append(execs, map[string]any{"namespace_execution_id": x.ID, "operation": "exec_command", "lifecycle_state": "running",
			"command": x.Cmd, "trace": x.Trace, "started": x.Started})
	}
	policy := "no_op"
	if s.Implicit {
		policy = "publish_then_destroy"
	}
	var resources any
	if latest != nil {
		resources = latest
	}
	out := map[string]any{"workspace_id": s.ID, "lifecycle_state": lifecycle, "finalization_state": s.FinalizationState,
		"network_profile": s.NetworkProfile, "finalize_policy": policy, "layers": layers, "namespace_fd_count": nsCount,
		"resources": resources, "active_namespace_executions": execs, "agent": s.Agent, "implicit": s.Implicit,
		"created": s.Created, "idle_seconds": int64(s.Idle.Seconds())}
	if s.Egress != nil {
		out["egress"] = s.Egress
	}
	return out
}

// eventStore describes the observability store (snapshot, daemon, health).
func (o *Observer) eventStore() map[string]any {
	streams := []telemetry.StreamStats{}
	for _, st := range o.Store.Streams() {
		streams = append(streams, st.Stats())
	}
	return map[string]any{"dir": o.Store.Dir, "streams": streams, "dropped": o.Store.Dropped()}
}
