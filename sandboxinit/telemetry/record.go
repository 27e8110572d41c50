package telemetry

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"
)

// Record kinds: the `kind` tag of every NDJSON line.
const (
	KindSpan    = "span"
	KindEvent   = "event"
	KindSample  = "sample"
	KindPublish = "publish"
)

// Span statuses (the seed's).
const (
	StatusCompleted = "completed"
	StatusError     = "error"
	StatusCancelled = "cancelled"
	StatusTimedOut  = "timed_out"
)

// Span is a finished unit of work of one trace. TS is its start.
type Span struct {
	Kind   string         `json:"kind"`
	TS     time.Time      `json:"ts"`
	Trace  string         `json:"trace"`
	Span   string         `json:"span"`
	Parent string         `json:"parent,omitempty"`
	Name   string         `json:"name"`
	DurMS  float64        `json:"dur_ms"`
	Status string         `json:"status"`
	Attrs  map[string]any `json:"attrs"`
}

// Event is a point in time of one trace (or of none: Trace "" for work no
// request started). Publish history records are events of KindPublish.
type Event struct {
	Kind   string         `json:"kind"`
	TS     time.Time      `json:"ts"`
	Trace  string         `json:"trace"`
	Parent string         `json:"parent,omitempty"`
	Name   string         `json:"name"`
	Attrs  map[string]any `json:"attrs"`
}

// Sample is one resource measurement of a scope ("sandbox", "stack" or a
// workspace session id). Its metrics are top-level keys of the record.
type Sample struct {
	TS      time.Time
	Scope   string
	Metrics map[string]any
}

// MarshalJSON flattens the metrics next to kind, ts and scope.
func (s *Sample) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(s.Metrics)+3)
	for k, v := range s.Metrics {
		m[k] = v
	}
	m["kind"], m["ts"], m["scope"] = KindSample, s.TS, s.Scope
	return json.Marshal(m)
}

func (s *Span) attrs() map[string]any     { return s.Attrs }
func (s *Span) setAttrs(m map[string]any) { s.Attrs = m }
func (e *Event) attrs() map[string]any    { return e.Attrs }
func (e *Event) setAttrs(m map[string]any) {
	e.Attrs = m
}

type attrRecord interface {
	attrs() map[string]any
	setAttrs(map[string]any)
}

// ErrTooLarge means a record does not fit the line cap even without its
// attributes.
var ErrTooLarge = errors.New("record exceeds the line cap")

// Encode renders a record as one line of at most MaxLineBytes-1 bytes. A
// span or event whose attributes make it longer keeps what fits of them
// (strings cut, lists shortened, the largest values first) and gets
// attrs._truncated = true.
func Encode(rec any) ([]byte, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode record: %w", err)
	}
	if len(b) < MaxLineBytes {
		return b, nil
	}
	ar, ok := rec.(attrRecord)
	if !ok {
		return nil, ErrTooLarge
	}
	attrs := ar.attrs()
	ab, _ := json.Marshal(attrs)
	budget := MaxLineBytes - 1 - (len(b) - len(ab)) - len(`,"_truncated":true`) - 2
	if budget < 0 {
		return nil, ErrTooLarge
	}
	defer ar.setAttrs(attrs)
	out := truncateMap(attrs, budget)
	out["_truncated"] = true
	ar.setAttrs(out)
	if b, err = json.Marshal(rec); err == nil && len(b) < MaxLineBytes {
		return b, nil
	}
	ar.setAttrs(map[string]any{"_truncated": true})
	if b, err = json.Marshal(rec); err == nil && len(b) < MaxLineBytes {
		return b, nil
	}
	return nil, ErrTooLarge
}

// truncateMap keeps what fits of m in about budget bytes of JSON: small
// values whole, the larger ones shrunk to an equal share of what is left.
func truncateMap(m map[string]any, budget int) map[string]any {
	type kv struct {
		k    string
		v    any
		size int
	}
	items := make([]kv, 0, len(m))
	for k, v := range m {
		b, err := json.Marshal(v)
		if err != nil {
			continue
		}
		items = append(items, kv{k, v, len(b)})
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].size != items[j].size {
			return items[i].size < items[j].size
		}
		return items[i].k < items[j].k
	})
	out := make(map[string]any, len(items)+1)
	left := budget
	for i, it := range items {
		keyCost := len(it.k) + 4 // "k":,
		share := left / (len(items) - i)
		if keyCost+it.size <= share {
			out[it.k] = it.v
			left -= keyCost + it.size
			continue
		}
		if v, n, ok := shrink(it.v, share-keyCost); ok {
			out[it.k] = v
			left -= keyCost + n
		}
	}
	return out
}

// shrink returns v cut to about budget bytes of JSON, and its size.
func shrink(v any, budget int) (any, int, bool) {
	if budget < 2 {
		return nil, 0, false
	}
	// Work on the JSON form: whatever Go type the caller used, it is a
	// string, list, object or scalar there.
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, 0, false
	}
	if len(raw) <= budget {
		return v, len(raw), true
	}
	var g any
	if json.Unmarshal(raw, &g) != nil {
		return nil, 0, false
	}
	switch t := g.(type) {
	case string:
		s := cutString(t, budget-2)
		for {
			b, _ := json.Marshal(s)
			if len(b) <= budget || s == "" {
				return s, len(b), true
			}
			s = cutString(s, len(s)-(len(b)-budget)-1)
		}
	case []any:
		out := []any{}
		used := 2
		for _, e := range t {
			b, _ := json.Marshal(e)
			if used+len(b)+1 > budget {
				break
			}
			out = append(out, e)
			used += len(b) + 1
		}
		return out, used, true
	case map[string]any:
		out := truncateMap(t, budget-2)
		b, _ := json.Marshal(out)
		return out, len(b), len(b) <= budget
	}
	return nil, 0, false
}

// cutString returns s cut to at most n bytes at a rune boundary.
func cutString(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Header is what queries filter on; every record kind has a subset.
type Header struct {
	Kind   string    `json:"kind"`
	TS     time.Time `json:"ts"`
	Trace  string    `json:"trace"`
	Span   string    `json:"span"`
	Parent string    `json:"parent"`
	Name   string    `json:"name"`
	Scope  string    `json:"scope"`
}

// ParseHeader parses the filter fields of one line. A line that is not a
// JSON object with a known kind and a timestamp is an error.
func ParseHeader(line []byte) (Header, error) {
	var h Header
	if err := json.Unmarshal(line, &h); err != nil {
		return h, fmt.Errorf("parse record: %w", err)
	}
	switch h.Kind {
	case KindSpan, KindEvent, KindSample, KindPublish:
	default:
		return h, fmt.Errorf("parse record: unknown kind %q", h.Kind)
	}
	if h.TS.IsZero() {
		return h, errors.New("parse record: no ts")
	}
	return h, nil
}
