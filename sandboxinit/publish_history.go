package sandboxinit

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

// Publish sources.
const (
	SourceSession     = "session"
	SourceImplicit    = "implicit"    // exec_command without a session
	SourceSessionless = "sessionless" // file operations without a session
)

// maxHistoryPaths caps the paths (and conflicts) one record lists; the
// counts are always complete.
const maxHistoryPaths = 50

// publishOutcome is what a publish path reports to recordPublish.
type publishOutcome struct {
	TxID, SessionID, Agent, Owner, Message, Source string
	Changes                                        *layerstack.ChangeSet
	Paths                                          []string // when there is no change set (sessionless)
	Result                                         *layerstack.PublishResult
	Err                                            error
}

func sourceOf(s *session) string {
	if s.rec.Implicit {
		return SourceImplicit
	}
	return SourceSession
}

func (o publishOutcome) outcome() string {
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

// recordPublish appends one publish record (fail-open, never under a quiet
// context). A replayed commit is not recorded twice.
func (d *Daemon) recordPublish(ctx context.Context, o publishOutcome) {
	if o.Result != nil && o.Result.Replayed {
		return
	}
	paths := o.Paths
	if o.Changes != nil {
		paths = make([]string, 0, min(len(o.Changes.Changes), maxHistoryPaths))
		for _, c := range o.Changes.Changes {
			paths = append(paths, c.Path)
		}
	}
	attrs := map[string]any{"txid": o.TxID, "workspace_session_id": o.SessionID, "agent": o.Agent, "owner": o.Owner,
		"source": o.Source, "outcome": o.outcome(), "message": o.Message, "path_count": len(paths), "paths": capList(paths)}
	if r := o.Result; r != nil {
		attrs["layer_id"], attrs["manifest_version"] = r.LayerID, r.Revision.ManifestVersion
		attrs["merged_paths"] = capList(r.MergedPaths)
	}
	var ce *layerstack.ConflictError
	if errors.As(o.Err, &ce) {
		cs := make([]map[string]any, 0, min(len(ce.Conflicts), maxHistoryPaths))
		for i, c := range ce.Conflicts {
			if i == maxHistoryPaths {
				break
			}
			cs = append(cs, map[string]any{"path": c.Path, "kind": c.Kind, "reason": c.Reason})
		}
		attrs["conflicts"], attrs["conflict_count"] = cs, len(ce.Conflicts)
		attrs["head_manifest_version"] = ce.Head.ManifestVersion
	} else if o.Err != nil {
		attrs["error"] = o.Err.Error()
	}
	telemetry.Record(ctx, d.obs.store.Publishes, &telemetry.Event{Kind: telemetry.KindPublish, TS: time.Now().UTC(),
		Trace: telemetry.TraceID(ctx), Parent: telemetry.SpanID(ctx), Name: "publish", Attrs: attrs})
}

func capList(s []string) []string {
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

func (d *Daemon) publishHistory(a PublishHistoryArgs) (map[string]any, error) {
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
	res, err := d.obs.store.Publishes.Query(q)
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

// sessionless runs the one-layer commit of a file operation without a
// session (commit) as a layerstack.publish span with a publish record.
func (d *Daemon) sessionless(ctx context.Context, txid, owner string, paths []string, commit func(ctx context.Context) (*layerstack.PublishResult, error)) error {
	ctx, sp := d.span(ctx, "layerstack.publish", map[string]any{"txid": txid, "paths": capList(paths)})
	res, err := commit(ctx)
	if res != nil {
		sp.Set("layer_id", res.LayerID)
	}
	sp.End(err)
	d.recordPublish(ctx, publishOutcome{TxID: txid, Owner: owner, Source: SourceSessionless, Paths: paths, Result: res, Err: err})
	return err
}
