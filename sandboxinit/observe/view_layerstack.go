package observe

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// Layer-entry listing limits (the seed's default of 500).
const (
	DefaultLayerEntries = 500
	MaxLayerEntries     = 10000
)

// LayerstackArgs are the layerstack view's arguments.
type LayerstackArgs struct {
	WorkspaceID string `json:"workspace_id,omitempty"`
	LayerID     string `json:"layer_id,omitempty"`
	WindowMS    int64  `json:"window_ms,omitempty"`
	Limit       int    `json:"limit,omitempty"`
	SandboxID   string `json:"sandbox_id,omitempty"`
}

// stackSummary is the layer stack in numbers (snapshot.stack, stack samples).
type stackSummary struct {
	ManifestVersion       int64    `json:"manifest_version"`
	RootHash              string   `json:"root_hash"`
	LayerCount            int      `json:"layer_count"`
	LayersBytes           int64    `json:"layers_bytes"`
	LayersAllocatedBytes  int64    `json:"layers_allocated_bytes"`
	StorageLogicalBytes   int64    `json:"storage_logical_bytes"`
	StorageAllocatedBytes int64    `json:"storage_allocated_bytes"`
	StagingEntryCount     int      `json:"staging_entry_count"`
	ActiveLeases          int      `json:"active_leases"`
	errors                []string // what could not be measured
}

// WarmLeaseOwner prefixes the owner of the lease a warm session's build
// holds while it starts or moves the session (sandboxinit's warm pool): a
// pin of the daemon's own for some milliseconds, at moments no caller
// chooses, not a workspace's. The views count no such lease.
const WarmLeaseOwner = "warm_session:"

// activeLeases counts the leases of workspaces and of callers' operations
// (an export, a squash's plan), leaving out the warm builder's.
func activeLeases(ls []*layerstack.Lease) int {
	n := 0
	for _, l := range ls {
		if !strings.HasPrefix(l.Owner, WarmLeaseOwner) {
			n++
		}
	}
	return n
}

func (o *Observer) stackSummary(man *layerstack.Manifest) stackSummary {
	store := o.src.Layers()
	st := stackSummary{ManifestVersion: man.Version, RootHash: man.RootHash(), LayerCount: len(man.Layers), ActiveLeases: activeLeases(store.Leases())}
	for _, l := range man.Layers {
		u, err := store.LayerUsage(l)
		if err != nil {
			st.errors = append(st.errors, err.Error())
		}
		st.LayersBytes += u.Bytes
		st.LayersAllocatedBytes += u.AllocatedBytes
	}
	su, err := store.StorageUsage()
	if err != nil {
		st.errors = append(st.errors, err.Error())
	}
	st.StorageLogicalBytes, st.StorageAllocatedBytes = su.LogicalBytes, su.AllocatedBytes
	n, err := store.StagingEntries()
	if err != nil {
		st.errors = append(st.errors, err.Error())
	}
	st.StagingEntryCount = n
	return st
}

// leasedBy maps layer ids to the live workspace sessions whose lease
// includes them.
func (o *Observer) leasedBy() map[string][]string {
	out := map[string][]string{}
	for _, l := range o.src.Layers().Leases() {
		ws, ok := strings.CutPrefix(l.Owner, "workspace_session:")
		if !ok {
			continue
		}
		for _, ml := range l.Layers {
			out[ml.ID] = append(out[ml.ID], ws)
		}
	}
	return out
}

// LayerstackView is the layer stack, one workspace's mounts (workspace_id)
// or one layer's entries (layer_id).
func (o *Observer) LayerstackView(a LayerstackArgs) (map[string]any, error) {
	switch {
	case a.LayerID != "":
		return o.layerEntriesView(a)
	case a.WorkspaceID != "":
		return o.workspaceLayersView(a)
	}
	store := o.src.Layers()
	man, err := store.Manifest()
	if err != nil {
		return nil, api.Errorf(api.KindNotFound, nil, "layer stack: %v", err)
	}
	st := o.stackSummary(man)
	leased := o.leasedBy()
	layers := make([]map[string]any, 0, len(man.Layers))
	for _, l := range man.Layers { // newest first, as the manifest lists them
		u, _ := store.LayerUsage(l)
		row := map[string]any{"layer_id": l.ID, "bytes": u.Bytes, "allocated_bytes": u.AllocatedBytes,
			"leased_by_workspaces": nonNil(leased[l.ID]), "booked_by": []string{}, "entries": u.Entries}
		if meta, err := store.LayerMeta(l.ID); err == nil {
			booked := []string{}
			if meta.Owner != "" {
				booked = append(booked, meta.Owner)
			}
			row["booked_by"] = booked
			row["kind"], row["txid"], row["agent"], row["message"], row["created"] = meta.Kind, meta.TxID, meta.Agent, meta.Message, meta.Time
			row["counts"] = meta.Counts
			if len(meta.Replace) > 0 {
				row["replaces"] = meta.Replace
			}
		}
		layers = append(layers, row)
	}
	trend, err := o.samplesSince(telemetry.Query{Scope: "stack"}, windowOr(a.WindowMS, 600000))
	out := map[string]any{"view": "layerstack", "manifest_version": man.Version, "root_hash": st.RootHash,
		"active_lease_count": st.ActiveLeases, "total_bytes": st.LayersBytes, "total_allocated_bytes": st.LayersAllocatedBytes,
		"storage_logical_bytes": st.StorageLogicalBytes, "storage_allocated_bytes": st.StorageAllocatedBytes,
		"staging_entry_count": st.StagingEntryCount, "layer_count": st.LayerCount, "layers": layers, "trend": trend,
		"errors": nonNil(st.errors)}
	if err != nil {
		out["errors"] = append(nonNil(st.errors), err.Error())
	}
	return out, nil
}

func (o *Observer) workspaceLayersView(a LayerstackArgs) (map[string]any, error) {
	s, err := o.src.Session(a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	lease, err := o.src.Layers().Lease(s.LeaseID)
	if err != nil {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"workspace_id": a.WorkspaceID}, "lease of %s: %v", a.WorkspaceID, err)
	}
	leased := o.leasedBy()
	mounts := make([]map[string]any, 0, len(lease.Layers))
	for _, l := range lease.Layers {
		others := []string{}
		for _, ws := range leased[l.ID] {
			if ws != s.ID {
				others = append(others, ws)
			}
		}
		mounts = append(mounts, map[string]any{"layer_id": l.ID, "shared_with": others})
	}
	bytes, entries, complete := upperBytes(s.Upper)
	return map[string]any{"view": "layerstack",
		"workspace": map[string]any{"workspace_id": s.ID, "lease_id": lease.ID, "manifest_version": lease.ManifestVersion,
			"root_hash": lease.RootHash, "layer_count": len(lease.Layers), "agent": s.Agent, "finalization_state": s.FinalizationState},
		"mounts": mounts, "upper_bytes": bytes, "upper_entries": entries, "upper_bytes_partial": !complete}, nil
}

func (o *Observer) layerEntriesView(a LayerstackArgs) (map[string]any, error) {
	store := o.src.Layers()
	l, ok := store.FindLayer(a.LayerID)
	if !ok {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"layer_id": a.LayerID}, "layer not found: %s", a.LayerID)
	}
	limit := a.Limit
	if limit <= 0 {
		limit = DefaultLayerEntries
	}
	limit = min(limit, MaxLayerEntries)
	ents, more, err := store.LayerEntries(l, limit)
	if err != nil {
		return nil, err
	}
	// The response cap holds for long paths too.
	size := 0
	for i, e := range ents {
		if size += len(e.Path) + 32; size > telemetry.MaxResponseBytes {
			ents, more = ents[:i], true
			break
		}
	}
	return map[string]any{"view": "layerstack", "layer_id": l.ID, "entries": ents, "truncated": more}, nil
}

// windowOr returns the window in ms, or def when none was given.
func windowOr(ms, def int64) int64 {
	if ms <= 0 {
		return def
	}
	return min(ms, 600000)
}

// samplesSince returns the samples q selects of the last windowMS, oldest
// first (a series reads forwards).
func (o *Observer) samplesSince(q telemetry.Query, windowMS int64) ([]json.RawMessage, error) {
	q.Kind, q.Ordered = telemetry.KindSample, true
	q.SinceMS = time.Now().UnixMilli() - windowMS
	res, err := o.Store.Samples.Query(q)
	out := res.Records
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	if out == nil {
		out = []json.RawMessage{}
	}
	return out, err
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
