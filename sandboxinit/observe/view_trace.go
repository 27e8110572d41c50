package observe

import (
	"encoding/json"
	"sort"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// TraceArgs are the trace view's arguments.
type TraceArgs struct {
	TraceID   string `json:"trace_id,omitempty"` // a request id, or "last" (default)
	SandboxID string `json:"sandbox_id,omitempty"`
}

// EventsArgs are the events view's arguments.
type EventsArgs struct {
	Name      string `json:"name,omitempty"`
	SinceMS   int64  `json:"since_ms,omitempty"`
	LastN     int    `json:"last_n,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// DefaultEventsLastN is how many events the events view returns without
// last_n and since_ms (with since_ms: up to the cap).
const DefaultEventsLastN = 100

// EventsView returns events newest first. since_ms keeps events strictly
// newer (unix ms), so a poller passing the newest ts it saw gets each
// event once.
func (o *Observer) EventsView(a EventsArgs) (map[string]any, error) {
	n := a.LastN
	switch {
	case n > 0:
	case a.SinceMS > 0:
		n = telemetry.MaxRecords // a poller asking for what is new wants all of it
	default:
		n = DefaultEventsLastN
	}
	res, err := o.Store.Events.Query(telemetry.Query{Kind: telemetry.KindEvent, Name: a.Name, SinceMS: a.SinceMS, Ordered: true, Limit: n})
	if err != nil {
		return nil, err
	}
	evs := res.Records
	if evs == nil {
		evs = []json.RawMessage{}
	}
	return map[string]any{"view": "events", "events": evs, "truncated": res.Truncated, "order": "newest_first"}, nil
}

// traceNode is one span of a trace view with what happened under it.
type traceNode struct {
	Span     json.RawMessage `json:"span"`
	OffsetMS float64         `json:"offset_ms"`
	Children []*traceNode    `json:"children"`
	Events   []traceEvent    `json:"events"`
	ts       int64
}

type traceEvent struct {
	OffsetMS float64         `json:"offset_ms"`
	Event    json.RawMessage `json:"event"`
}

// TraceView nests a trace's spans by parent, offsets them from the trace's
// first record and puts events inline under their span.
func (o *Observer) TraceView(a TraceArgs) (map[string]any, error) {
	id := a.TraceID
	if id == "" || id == "last" {
		res, err := o.Store.Events.Query(telemetry.Query{Kind: telemetry.KindSpan, Name: "daemon.dispatch", Limit: 1})
		if err != nil {
			return nil, err
		}
		id = ""
		if len(res.Headers) > 0 {
			id = res.Headers[0].Trace
		}
	}
	out := map[string]any{"view": "trace", "trace": id, "spans": []*traceNode{}, "events": []traceEvent{}, "truncated": false, "request_ids": []string{}}
	if id == "" {
		return out, nil
	}
	res, err := o.Store.Events.Query(telemetry.Query{Trace: id})
	if err != nil {
		return nil, err
	}
	out["truncated"] = res.Truncated
	if len(res.Records) == 0 {
		return out, nil
	}
	// The request ids the trace id matched (a workflow's steps each have one).
	seen := map[string]bool{}
	matched := []string{}
	for i := len(res.Headers) - 1; i >= 0; i-- {
		if tr := res.Headers[i].Trace; !seen[tr] && len(matched) < 20 {
			seen[tr] = true
			matched = append(matched, tr)
		}
	}
	out["request_ids"] = matched
	start := res.Headers[0].TS.UnixMicro()
	for _, h := range res.Headers {
		start = min(start, h.TS.UnixMicro())
	}
	offset := func(us int64) float64 { return float64(us-start) / 1000 }
	nodes := map[string]*traceNode{}
	parent := map[string]string{}
	for i, h := range res.Headers {
		if _, dup := nodes[h.Span]; h.Kind == telemetry.KindSpan && !dup {
			us := h.TS.UnixMicro()
			nodes[h.Span] = &traceNode{Span: res.Records[i], OffsetMS: offset(us), Children: []*traceNode{}, Events: []traceEvent{}, ts: us}
			parent[h.Span] = h.Parent
		}
	}
	// A span hangs under its parent unless that would close a loop (only a
	// damaged store could hold one; the view must still end).
	underItself := func(span string) bool {
		for p, n := parent[span], 0; p != "" && n <= len(parent); p, n = parent[p], n+1 {
			if p == span {
				return true
			}
		}
		return false
	}
	var roots []*traceNode
	var orphans []traceEvent
	placed := map[string]bool{}
	// Records come newest first; walk them oldest first so children and
	// events land in time order.
	for i := len(res.Headers) - 1; i >= 0; i-- {
		h := res.Headers[i]
		switch h.Kind {
		case telemetry.KindSpan:
			n := nodes[h.Span]
			if placed[h.Span] || n.Span == nil || &n.Span[0] != &res.Records[i][0] {
				continue // a duplicate span id
			}
			placed[h.Span] = true
			if p := nodes[h.Parent]; p != nil && h.Parent != "" && !underItself(h.Span) {
				p.Children = append(p.Children, n)
			} else {
				roots = append(roots, n)
			}
		case telemetry.KindEvent:
			ev := traceEvent{OffsetMS: offset(h.TS.UnixMicro()), Event: res.Records[i]}
			if p := nodes[h.Parent]; p != nil && h.Parent != "" {
				p.Events = append(p.Events, ev)
			} else {
				orphans = append(orphans, ev)
			}
		}
	}
	byStart := func(ns []*traceNode) {
		sort.SliceStable(ns, func(i, j int) bool { return ns[i].ts < ns[j].ts })
	}
	byStart(roots)
	for _, n := range nodes {
		byStart(n.Children)
	}
	if roots != nil {
		out["spans"] = roots
	}
	if orphans != nil {
		out["events"] = orphans
	}
	return out, nil
}
