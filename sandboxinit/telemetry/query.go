package telemetry

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Response caps of every query (seed-spec §6).
const (
	MaxRecords       = 500
	MaxResponseBytes = 256 << 10
	// orderSlackMS is how far out of order (by ts) records of an
	// append-ordered stream may be: timestamps are taken just before the
	// append, so concurrent writers may swap by microseconds.
	orderSlackMS = 1000
)

// Query selects records of a stream, newest first.
type Query struct {
	Kind  string // "" for any
	Name  string // exact name; "" for any
	Scope string // samples' scope; "" for any
	// Trace selects one trace: records whose trace is Trace, starts with
	// Trace+"/" or ends with "/"+Trace. The workflow layer's daemon calls
	// carry "<workflow id>/<step>" and "<workflow id>/update/<request id>":
	// either end finds them.
	Trace string
	// SinceMS keeps records with ts (unix ms) > SinceMS when > 0.
	SinceMS int64
	// Ordered says the stream's records were appended in ts order (events,
	// samples; not spans, which are written when they end), so the scan
	// stops at the first record older than SinceMS.
	Ordered bool
	// Match is an extra filter on the parsed header and the raw line.
	Match func(h Header, line []byte) bool
	// Limit and MaxBytes are raised to nothing: at most MaxRecords and
	// MaxResponseBytes; zero means the cap.
	Limit    int
	MaxBytes int
}

// Result is what a query found, newest first.
type Result struct {
	Records []json.RawMessage
	Headers []Header
	// Truncated: more records matched than the caps allowed.
	Truncated bool
	// Skipped counts damaged lines (unparsable or over the line cap).
	Skipped int
}

// Query scans the stream from its newest record backwards. Memory is
// bounded by the response caps plus one read chunk and one line: the
// segments are streamed, never loaded.
func (s *Stream) Query(q Query) (Result, error) {
	var res Result
	if s == nil {
		return res, nil
	}
	limit, maxBytes := q.Limit, q.MaxBytes
	if limit <= 0 || limit > MaxRecords {
		limit = MaxRecords
	}
	if maxBytes <= 0 || maxBytes > MaxResponseBytes {
		maxBytes = MaxResponseBytes
	}
	var kindTag, traceTag []byte
	if q.Kind != "" {
		kindTag = []byte(`"kind":"` + q.Kind + `"`)
	}
	if q.Trace != "" {
		b, _ := json.Marshal(q.Trace)
		traceTag = b[1 : len(b)-1] // the id as it is written, wherever it sits in the trace
	}
	segs, err := s.snapshot()
	if err != nil {
		return res, err
	}
	defer closeSegments(segs)
	used := 0
	stop := false
	visit := func(line []byte) bool {
		// Cheap byte tests first: the writer puts these tags verbatim.
		if kindTag != nil && !bytes.Contains(line, kindTag) {
			return true
		}
		if traceTag != nil && !bytes.Contains(line, traceTag) {
			return true
		}
		h, err := ParseHeader(line)
		if err != nil {
			res.Skipped++
			return true
		}
		if q.SinceMS > 0 && h.TS.UnixMilli() <= q.SinceMS {
			if q.Ordered && h.TS.UnixMilli() < q.SinceMS-orderSlackMS {
				stop = true
				return false
			}
			return true
		}
		if (q.Kind != "" && h.Kind != q.Kind) || (q.Name != "" && h.Name != q.Name) || (q.Scope != "" && h.Scope != q.Scope) {
			return true
		}
		if q.Trace != "" && !TraceMatches(h.Trace, q.Trace) {
			return true
		}
		if q.Match != nil && !q.Match(h, line) {
			return true
		}
		if len(res.Records) >= limit || used+len(line) > maxBytes {
			res.Truncated, stop = true, true
			return false
		}
		res.Records = append(res.Records, json.RawMessage(bytes.Clone(line)))
		res.Headers = append(res.Headers, h)
		used += len(line) + 1
		return true
	}
	for _, sg := range segs {
		skipped, err := reverseLines(sg.f, sg.size, s.maxLine, visit)
		res.Skipped += skipped
		if err != nil {
			return res, fmt.Errorf("read %s: %w", s.name, err)
		}
		if stop {
			break
		}
	}
	return res, nil
}

// TraceMatches reports whether a record's trace belongs to the trace id
// asked for (see Query.Trace).
func TraceMatches(trace, id string) bool {
	return trace == id || strings.HasPrefix(trace, id+"/") || strings.HasSuffix(trace, "/"+id)
}
