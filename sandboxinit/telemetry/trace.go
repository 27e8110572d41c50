package telemetry

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Tracer writes the spans and events of requests to a stream. The trace id
// is the request id; span ids are "<proc>-<seq>" with a sequence that starts
// at the process's start time in microseconds (base 36), so ids stay unique
// in a trace that outlives a daemon restart (a workflow retrying a step).
// A nil Tracer, and any context marked Quiet, records nothing.
type Tracer struct {
	stream *Stream
	proc   string
	seq    atomic.Uint64
	now    func() time.Time
}

// NewTracer returns a tracer writing to stream; proc is the process token
// of its span ids ("d" for the daemon). now nil means time.Now.
func NewTracer(stream *Stream, proc string, now func() time.Time) *Tracer {
	if now == nil {
		now = time.Now
	}
	t := &Tracer{stream: stream, proc: proc, now: now}
	t.seq.Store(uint64(now().UnixMicro()))
	return t
}

type ctxKey struct{}

type traceCtx struct {
	trace string
	span  string
	quiet bool
}

func fromContext(ctx context.Context) traceCtx {
	tc, _ := ctx.Value(ctxKey{}).(traceCtx)
	return tc
}

// WithTrace starts trace id (a request id) in ctx.
func WithTrace(ctx context.Context, trace string) context.Context {
	return context.WithValue(ctx, ctxKey{}, traceCtx{trace: trace})
}

// Quiet marks ctx so that nothing is recorded under it: reading an
// observability view must leave every store unchanged.
func Quiet(ctx context.Context) context.Context {
	tc := fromContext(ctx)
	tc.quiet = true
	return context.WithValue(ctx, ctxKey{}, tc)
}

// TraceID returns the trace of ctx ("" if none).
func TraceID(ctx context.Context) string { return fromContext(ctx).trace }

// SpanID returns the span current in ctx ("" if none).
func SpanID(ctx context.Context) string { return fromContext(ctx).span }

// ActiveSpan is a started span; End writes it. Its methods are safe for
// concurrent use and End writes once.
type ActiveSpan struct {
	t     *Tracer
	rec   Span
	mu    sync.Mutex
	ended bool
}

// Start begins a span named name under the span in ctx (if any) and returns
// a context carrying it. attrs is owned by the span from here on.
func (t *Tracer) Start(ctx context.Context, name string, attrs map[string]any) (context.Context, *ActiveSpan) {
	tc := fromContext(ctx)
	if t == nil || tc.quiet {
		return ctx, nil
	}
	if attrs == nil {
		attrs = map[string]any{}
	}
	id := t.proc + "-" + strconv.FormatUint(t.seq.Add(1), 36)
	sp := &ActiveSpan{t: t, rec: Span{Kind: KindSpan, TS: t.now().UTC(), Trace: tc.trace, Span: id, Parent: tc.span, Name: name, Attrs: attrs}}
	tc.span = id
	return context.WithValue(ctx, ctxKey{}, tc), sp
}

// Set adds an attribute.
func (s *ActiveSpan) Set(key string, v any) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.rec.Attrs[key] = v
	s.mu.Unlock()
}

// ID returns the span's id ("" for a nil span).
func (s *ActiveSpan) ID() string {
	if s == nil {
		return ""
	}
	return s.rec.Span
}

// End writes the span with the status err implies.
func (s *ActiveSpan) End(err error) { s.EndStatus(StatusOf(err), err) }

// EndStatus writes the span with status; err, if any, becomes attrs.error.
func (s *ActiveSpan) EndStatus(status string, err error) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	s.rec.DurMS = float64(s.t.now().Sub(s.rec.TS).Microseconds()) / 1000
	s.rec.Status = status
	if err != nil {
		s.rec.Attrs["error"] = err.Error()
	}
	s.t.write(&s.rec)
}

// StatusOf maps an error to a span status.
func StatusOf(err error) string {
	switch {
	case err == nil:
		return StatusCompleted
	case errors.Is(err, context.Canceled):
		return StatusCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return StatusTimedOut
	}
	return StatusError
}

// Event records a point event under the span in ctx.
func (t *Tracer) Event(ctx context.Context, name string, attrs map[string]any) {
	tc := fromContext(ctx)
	if t == nil || tc.quiet {
		return
	}
	if attrs == nil {
		attrs = map[string]any{}
	}
	t.write(&Event{Kind: KindEvent, TS: t.now().UTC(), Trace: tc.trace, Parent: tc.span, Name: name, Attrs: attrs})
}

// Record writes any record (publish history) unless ctx is quiet.
func Record(ctx context.Context, s *Stream, rec any) {
	if s == nil || fromContext(ctx).quiet {
		return
	}
	b, err := Encode(rec)
	if err != nil {
		s.drop(err)
		return
	}
	s.Append(b)
}

func (t *Tracer) write(rec any) {
	b, err := Encode(rec)
	if err != nil {
		t.stream.drop(err)
		return
	}
	t.stream.Append(b)
}
