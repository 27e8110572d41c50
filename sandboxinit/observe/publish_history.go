package observe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// Publish history: every publish outcome (committed, no-op, rejected,
// failed), from sessions, implicit sessions and sessionless writes, as a
// bounded stream on the state volume. Committed layers also have their
// metadata and the store's audit log; rejected publishes exist only here.

// Publish outcomes.
const (
	OutcomeMerged   = "merged"   // committed, some paths merged line by line with others' changes
	OutcomeClean    = "clean"    // committed without merging
	OutcomeNoOp     = "no_op"    // nothing to commit
	OutcomeConflict = "conflict" // rejected: nothing committed
	OutcomeFailed   = "failed"   // an error other than a conflict
)

// maxHistoryPaths caps the paths (and conflicts) one record lists; the
// counts are always complete.
const maxHistoryPaths = 50

// PublishOutcome is what a publish path reports to RecordPublish.
type PublishOutcome struct {
	TxID, SessionID, Agent, Owner, Message, Source string // Source: session, implicit or sessionless
	Changes                                        *layerstack.ChangeSet
	Paths                                          []string // when there is no change set (sessionless)
	Result                                         *layerstack.PublishResult
	Err                                            error
}

func (o PublishOutcome) outcome() string {
	var ce *layerstack.ConflictError
	switch {
	case errors.As(o.Err, &ce):
		return OutcomeConflict
	case o.Err != nil:
		return OutcomeFailed
	case o.Result == nil || o.Result.NoOp:
		return OutcomeNoOp
	case len(o.Result.MergedPaths) > 0:
		return OutcomeMerged
	}
	return OutcomeClean
}

// RecordPublish appends one publish record (fail-open, never under a quiet
// context). A replayed commit is not recorded twice.
func (o *Observer) RecordPublish(ctx context.Context, p PublishOutcome) {
	if p.Result != nil && p.Result.Replayed {
		return
	}
	paths := p.Paths
	if p.Changes != nil {
		paths = make([]string, 0, min(len(p.Changes.Changes), maxHistoryPaths))
		for _, c := range p.Changes.Changes {
			paths = append(paths, c.Path)
		}
	}
	attrs := map[string]any{"txid": p.TxID, "workspace_session_id": p.SessionID, "agent": p.Agent, "owner": p.Owner,
		"source": p.Source, "outcome": p.outcome(), "message": p.Message, "path_count": len(paths), "paths": CapList(paths)}
	if r := p.Result; r != nil {
		attrs["layer_id"], attrs["manifest_version"] = r.LayerID, r.Revision.ManifestVersion
		attrs["merged_paths"] = CapList(r.MergedPaths)
	}
	var ce *layerstack.ConflictError
	if errors.As(p.Err, &ce) {
		cs := make([]map[string]any, 0, min(len(ce.Conflicts), maxHistoryPaths))
		for i, c := range ce.Conflicts {
			if i == maxHistoryPaths {
				break
			}
			cs = append(cs, map[string]any{"path": c.Path, "kind": c.Kind, "reason": c.Reason})
		}
		attrs["conflicts"], attrs["conflict_count"] = cs, len(ce.Conflicts)
		attrs["head_manifest_version"] = ce.Head.ManifestVersion
	} else if p.Err != nil {
		attrs["error"] = p.Err.Error()
	}
	telemetry.Record(ctx, o.Store.Publishes, &telemetry.Event{Kind: telemetry.KindPublish, TS: time.Now().UTC(),
		Trace: telemetry.TraceID(ctx), Parent: telemetry.SpanID(ctx), Name: "publish", Attrs: attrs})
}

// CapList is s capped to maxHistoryPaths, never nil.
func CapList(s []string) []string {
	if s == nil {
		return []string{}
	}
	if len(s) > maxHistoryPaths {
		return s[:maxHistoryPaths]
	}
	return s
}

// historyEntry is one row of the publish_history view.
type historyEntry struct {
	TxID               string           `json:"txid"`
	WorkspaceSessionID string           `json:"workspace_session_id"`
	Agent              string           `json:"agent"`
	Time               time.Time        `json:"time"`
	LayerID            string           `json:"layer_id"`
	Outcome            string           `json:"outcome"`
	Source             string           `json:"source"`
	Owner              string           `json:"owner"`
	Message            string           `json:"message"`
	Paths              []string         `json:"paths"`
	PathCount          int              `json:"path_count"`
	MergedPaths        []string         `json:"merged_paths"`
	Conflicts          []map[string]any `json:"conflicts"`
	ConflictCount      int              `json:"conflict_count"`
	ManifestVersion    int64            `json:"manifest_version,omitempty"`
	Error              string           `json:"error,omitempty"`
	Trace              string           `json:"trace"`
	Truncated          bool             `json:"truncated,omitempty"`
}

// PublishHistoryArgs are publish_history's arguments.
type PublishHistoryArgs struct {
	Limit              int    `json:"limit,omitempty"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	SandboxID          string `json:"sandbox_id,omitempty"`
}

// PublishHistory lists publish records newest first.
func (o *Observer) PublishHistory(a PublishHistoryArgs) (map[string]any, error) {
	limit := a.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, telemetry.MaxRecords)
	q := telemetry.Query{Kind: telemetry.KindPublish, Ordered: true, Limit: limit}
	if a.WorkspaceSessionID != "" {
		tag, _ := json.Marshal(a.WorkspaceSessionID)
		want := append([]byte(`"workspace_session_id":`), tag...)
		q.Match = func(_ telemetry.Header, line []byte) bool { return bytes.Contains(line, want) }
	}
	res, err := o.Store.Publishes.Query(q)
	if err != nil {
		return nil, err
	}
	out := make([]historyEntry, 0, len(res.Records))
	for i, raw := range res.Records {
		var ev struct {
			Attrs struct {
				historyEntry
				Truncated bool `json:"_truncated"`
			} `json:"attrs"`
		}
		if json.Unmarshal(raw, &ev) != nil {
			continue
		}
		e := ev.Attrs.historyEntry
		if a.WorkspaceSessionID != "" && e.WorkspaceSessionID != a.WorkspaceSessionID {
			continue
		}
		e.Time, e.Trace, e.Truncated = res.Headers[i].TS, res.Headers[i].Trace, ev.Attrs.Truncated
		for _, p := range []*[]string{&e.Paths, &e.MergedPaths} {
			if *p == nil {
				*p = []string{}
			}
		}
		if e.Conflicts == nil {
			e.Conflicts = []map[string]any{}
		}
		out = append(out, e)
	}
	return map[string]any{"view": "publish_history", "publishes": out, "truncated": res.Truncated}, nil
}
