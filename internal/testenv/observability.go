package testenv

import (
	"encoding/json"
	"sort"
	"testing"
)

// ObservabilityKeys are the seed contract's frozen key sets of the
// observability views (seed-contract §0.3, spec §2.4): extra keys are
// allowed, missing ones are not. Nested shapes are named view.path.
var ObservabilityKeys = map[string][]string{
	"snapshot":           {"sandbox_id", "lifecycle_state", "availability", "sampled_at_unix_ms", "errors", "daemon", "resources", "workspaces", "stack"},
	"snapshot.daemon":    {"daemon_pid", "runtime_dir", "event_store"},
	"snapshot.resources": {"latest", "history"},
	"snapshot.stack":     {"layer_count", "layers_bytes", "layers_allocated_bytes", "storage_allocated_bytes", "staging_entry_count", "active_leases"},
	"snapshot.workspace": {"workspace_id", "lifecycle_state", "finalization_state", "network_profile", "finalize_policy", "layers",
		"namespace_fd_count", "resources", "active_namespace_executions"},
	"snapshot.workspace.layers":    {"base_root_hash", "layer_count"},
	"snapshot.workspace.execution": {"namespace_execution_id", "operation", "lifecycle_state", "command"},
	"trace":                        {"view", "trace", "spans"},
	"trace.node":                   {"span", "offset_ms", "children", "events"},
	"trace.span":                   {"ts", "trace", "span", "name", "dur_ms", "status", "attrs"},
	"trace.event":                  {"offset_ms", "event"},
	"events":                       {"view", "events"},
	"events.event":                 {"ts", "trace", "name", "attrs"},
	"resources":                    {"view", "scope", "sandbox_id", "source", "availability", "errors", "series"},
	"daemon":                       {"view", "scope", "daemon"},
	"daemon.daemon":                {"process", "runtime", "ownership", "event_store"},
	"topology":                     {"view", "scope", "topology"},
	"cgroup":                       {"view", "scope", "series", "topology"},
	"cgroup.topology":              {"schema_version", "available", "source", "error", "truncated", "warnings", "workspaces"},
	"cgroup.topology.workspace":    {"workspace_id", "state", "holder_pid", "pid_namespace", "mount_namespace", "processes"},
	"cgroup.topology.process": {"pid", "namespace_pid", "parent_pid", "name", "state", "kind", "cgroup_memberships",
		"resident_memory_bytes", "cpu_time_us", "start_time_ticks"},
	"layerstack": {"view", "manifest_version", "root_hash", "active_lease_count", "total_bytes", "total_allocated_bytes",
		"storage_logical_bytes", "storage_allocated_bytes", "staging_entry_count", "layers", "trend"},
	"layerstack.layer":           {"layer_id", "bytes", "allocated_bytes", "leased_by_workspaces", "booked_by"},
	"layerstack.workspace":       {"view", "workspace", "mounts", "upper_bytes"},
	"layerstack.workspace.mount": {"layer_id", "shared_with"},
	"layerstack.entries":         {"view", "layer_id", "entries", "truncated"},
	"layerstack.entry":           {"path", "kind"},
	// publish_history is ours (not in the seed).
	"publish_history":       {"view", "publishes"},
	"publish_history.entry": {"txid", "workspace_session_id", "agent", "time", "layer_id", "outcome", "paths", "path_count", "conflicts", "message"},
}

// RequireKeys fails t when m lacks any key of the named shape.
func RequireKeys(t testing.TB, shape string, m map[string]any) {
	t.Helper()
	keys, ok := ObservabilityKeys[shape]
	if !ok {
		t.Fatalf("no key set named %q", shape)
	}
	var missing []string
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		b, _ := json.Marshal(m)
		t.Errorf("%s: missing seed-contract keys %v in %.2000s", shape, missing, b)
	}
}

// ViewCall runs one daemon view and returns its decoded result.
type ViewCall func(op string, args map[string]any) map[string]any

// CheckObservabilityViews runs every observability view of a sandbox
// through call and checks each shape, nested ones included, against
// ObservabilityKeys. The sandbox needs a base and at least one live
// workspace session; traces and events need some recorded activity.
func CheckObservabilityViews(t testing.TB, call ViewCall) {
	t.Helper()
	obj := func(shape string, v any) map[string]any {
		t.Helper()
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: not an object: %#v", shape, v)
		}
		RequireKeys(t, shape, m)
		return m
	}
	list := func(shape string, v any) []any {
		t.Helper()
		l, ok := v.([]any)
		if !ok {
			t.Fatalf("%s: not a list: %#v", shape, v)
		}
		return l
	}

	snap := obj("snapshot", call("snapshot", nil))
	obj("snapshot.daemon", snap["daemon"])
	obj("snapshot.resources", snap["resources"])
	obj("snapshot.stack", snap["stack"])
	wss := list("snapshot.workspaces", snap["workspaces"])
	if len(wss) == 0 {
		t.Fatalf("snapshot lists no workspace session")
	}
	var wsID string
	for _, w := range wss {
		wm := obj("snapshot.workspace", w)
		obj("snapshot.workspace.layers", wm["layers"])
		for _, x := range list("snapshot.workspace.active_namespace_executions", wm["active_namespace_executions"]) {
			obj("snapshot.workspace.execution", x)
		}
		wsID, _ = wm["workspace_id"].(string)
	}

	tr := obj("trace", call("trace", map[string]any{"trace_id": "last"}))
	spans := list("trace.spans", tr["spans"])
	if len(spans) == 0 {
		t.Errorf("the last trace has no spans: %v", tr)
	}
	var walk func(v any)
	walk = func(v any) {
		n := obj("trace.node", v)
		obj("trace.span", n["span"])
		for _, e := range list("trace.node.events", n["events"]) {
			obj("events.event", obj("trace.event", e)["event"])
		}
		for _, c := range list("trace.node.children", n["children"]) {
			walk(c)
		}
	}
	for _, s := range spans {
		walk(s)
	}

	evs := obj("events", call("events", map[string]any{"last_n": 50}))
	if len(list("events.events", evs["events"])) == 0 {
		t.Errorf("no events")
	}
	for _, e := range list("events.events", evs["events"]) {
		obj("events.event", e)
	}

	obj("resources", call("resources", map[string]any{"window_ms": 600000}))
	obj("daemon.daemon", obj("daemon", call("daemon", nil))["daemon"])
	checkTopology := func(v any) {
		top := obj("cgroup.topology", v)
		for _, w := range list("cgroup.topology.workspaces", top["workspaces"]) {
			wm := obj("cgroup.topology.workspace", w)
			for _, p := range list("cgroup.topology.processes", wm["processes"]) {
				obj("cgroup.topology.process", p)
			}
		}
	}
	checkTopology(obj("topology", call("topology", nil))["topology"])
	for _, scope := range []string{"sandbox", wsID} {
		cg := obj("cgroup", call("cgroup", map[string]any{"scope": scope, "window_ms": 600000}))
		list("cgroup.series", cg["series"])
		checkTopology(cg["topology"])
	}

	ls := obj("layerstack", call("layerstack", nil))
	layers := list("layerstack.layers", ls["layers"])
	if len(layers) == 0 {
		t.Fatalf("layerstack lists no layer")
	}
	for _, l := range layers {
		lm := obj("layerstack.layer", l)
		list("layerstack.layer.booked_by", lm["booked_by"])
	}
	list("layerstack.trend", ls["trend"])
	lw := obj("layerstack.workspace", call("layerstack", map[string]any{"workspace_id": wsID}))
	for _, m := range list("layerstack.workspace.mounts", lw["mounts"]) {
		obj("layerstack.workspace.mount", m)
	}
	first := layers[0].(map[string]any)["layer_id"]
	le := obj("layerstack.entries", call("layerstack", map[string]any{"layer_id": first}))
	for _, e := range list("layerstack.entries.entries", le["entries"]) {
		obj("layerstack.entry", e)
	}

	ph := obj("publish_history", call("publish_history", nil))
	for _, p := range list("publish_history.publishes", ph["publishes"]) {
		obj("publish_history.entry", p)
	}
}
