package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func fixedTracer(s *Stream) (*Tracer, *time.Time) {
	now := t0
	return NewTracer(s, "d", func() time.Time { return now }), &now
}

func TestQueryCaps(t *testing.T) {
	s, err := OpenStream(t.TempDir(), "events", 64<<20)
	require.NoError(t, err)
	defer s.Close()
	tr, now := fixedTracer(s)
	for i := 0; i < 1200; i++ {
		*now = now.Add(time.Millisecond)
		tr.Event(WithTrace(t.Context(), "r"), "small", map[string]any{"i": i})
	}
	res, err := s.Query(Query{Kind: KindEvent})
	require.NoError(t, err)
	require.Len(t, res.Records, MaxRecords)
	require.True(t, res.Truncated)
	require.Contains(t, string(res.Records[0]), `"i":1199`, "newest first")

	res, err = s.Query(Query{Kind: KindEvent, Limit: 5000})
	require.NoError(t, err)
	require.Len(t, res.Records, MaxRecords, "a larger limit is capped")

	for i := 0; i < 100; i++ {
		tr.Event(WithTrace(t.Context(), "r"), "big", map[string]any{"pad": strings.Repeat("b", 8000)})
	}
	res, err = s.Query(Query{Name: "big"})
	require.NoError(t, err)
	require.True(t, res.Truncated)
	total := 0
	for _, r := range res.Records {
		total += len(r)
	}
	require.LessOrEqual(t, total, MaxResponseBytes)
	require.Greater(t, total, MaxResponseBytes-10000)
}

func TestQueryFilters(t *testing.T) {
	s, err := OpenStream(t.TempDir(), "events", 0)
	require.NoError(t, err)
	defer s.Close()
	tr, now := fixedTracer(s)
	ctx, sp := tr.Start(WithTrace(t.Context(), "wf-1/publish_prepare"), "daemon.dispatch", nil)
	tr.Event(ctx, "lease.acquired", nil)
	sp.End(nil)
	*now = now.Add(time.Second)
	tr.Event(WithTrace(t.Context(), "wf-1/publish_commit"), "workspace_session.published", nil)
	tr.Event(WithTrace(t.Context(), "wf-10"), "other", nil)
	*now = now.Add(time.Second)
	tr.Event(WithTrace(t.Context(), "x"), "workspace_session.published", nil)

	names := func(q Query) []string {
		res, err := s.Query(q)
		require.NoError(t, err)
		var out []string
		for _, h := range res.Headers {
			out = append(out, h.Trace+":"+h.Name)
		}
		return out
	}
	require.Equal(t, []string{"wf-1/publish_commit:workspace_session.published", "wf-1/publish_prepare:daemon.dispatch", "wf-1/publish_prepare:lease.acquired"},
		names(Query{Trace: "wf-1"}), "a trace includes its steps, not wf-10")
	tr.Event(WithTrace(t.Context(), "sandbox/eos-1/update/rid-9"), "workspace_session.created", nil)
	tr.Event(WithTrace(t.Context(), "sandbox/eos-1/update/rid-99"), "workspace_session.created", nil)
	require.Equal(t, []string{"sandbox/eos-1/update/rid-9:workspace_session.created"}, names(Query{Trace: "rid-9"}),
		"a request id finds the workflow update that carried it")
	require.Equal(t, []string{"x:workspace_session.published", "wf-1/publish_commit:workspace_session.published"}, names(Query{Kind: KindEvent, Name: "workspace_session.published"}))
	require.Equal(t, []string{"sandbox/eos-1/update/rid-99:workspace_session.created", "sandbox/eos-1/update/rid-9:workspace_session.created", "x:workspace_session.published"},
		names(Query{Kind: KindEvent, SinceMS: t0.Add(time.Second).UnixMilli(), Ordered: true}))
	require.Len(t, names(Query{Kind: KindSpan}), 1)
	require.Len(t, names(Query{Scope: "nope"}), 0)
}

// Reading a stream near its budget allocates little beyond the answer: the
// segments are streamed, not loaded.
func TestQueryBoundedMemory(t *testing.T) {
	s, err := OpenStream(t.TempDir(), "events", DefaultEventBudget)
	require.NoError(t, err)
	defer s.Close()
	tr, now := fixedTracer(s)
	for s.Stats().Bytes < DefaultEventBudget*9/10 {
		*now = now.Add(time.Millisecond)
		tr.Event(WithTrace(t.Context(), "r"), "e", map[string]any{"pad": strings.Repeat("m", 400)})
	}
	var base, mid runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	seen := 0
	// Mid-scan, collect garbage and look at what is live: the scan's own
	// state, not the stream.
	res, err := s.Query(Query{Kind: KindEvent, Match: func(Header, []byte) bool {
		if seen++; seen == 3000 {
			runtime.GC()
			runtime.ReadMemStats(&mid)
		}
		return false
	}})
	require.NoError(t, err)
	require.Empty(t, res.Records)
	require.Greater(t, seen, 3000)
	live := int64(mid.HeapAlloc) - int64(base.HeapAlloc)
	require.Less(t, live, int64(256<<10), "live heap while scanning a 4 MiB stream")
	t.Logf("scanned %d records (%d bytes), %d bytes live mid-scan", seen, s.Stats().Bytes, live)
}

func TestTracerNestsAndQuiet(t *testing.T) {
	s, err := OpenStream(t.TempDir(), "events", 0)
	require.NoError(t, err)
	defer s.Close()
	tr, now := fixedTracer(s)
	ctx, root := tr.Start(WithTrace(t.Context(), "rid-1"), "daemon.dispatch", map[string]any{"op": "exec_command"})
	cctx, child := tr.Start(ctx, "command.exec", nil)
	tr.Event(cctx, "lease.acquired", nil)
	*now = now.Add(1500 * time.Microsecond)
	child.EndStatus(StatusTimedOut, nil)
	child.End(nil) // once only
	root.End(fmt.Errorf("boom"))

	res, err := s.Query(Query{Trace: "rid-1"})
	require.NoError(t, err)
	require.Len(t, res.Records, 3)
	var spans []Span
	var ev Event
	for _, r := range res.Records {
		if strings.Contains(string(r), `"kind":"span"`) {
			var sp Span
			require.NoError(t, json.Unmarshal(r, &sp))
			spans = append(spans, sp)
		} else {
			require.NoError(t, json.Unmarshal(r, &ev))
		}
	}
	require.Equal(t, "daemon.dispatch", spans[0].Name)
	require.Equal(t, StatusError, spans[0].Status)
	require.Equal(t, "boom", spans[0].Attrs["error"])
	require.Equal(t, StatusTimedOut, spans[1].Status)
	require.Equal(t, 1.5, spans[1].DurMS)
	require.Equal(t, spans[0].Span, spans[1].Parent)
	require.Equal(t, spans[1].Span, ev.Parent)
	require.True(t, strings.HasPrefix(spans[0].Span, "d-"))

	before := s.Stats()
	q := Quiet(WithTrace(t.Context(), "rid-2"))
	qctx, sp := tr.Start(q, "daemon.dispatch", nil)
	tr.Event(qctx, "x", nil)
	sp.End(nil)
	Record(qctx, s, &Event{Kind: KindPublish, TS: t0, Name: "publish"})
	require.Equal(t, before, s.Stats(), "a quiet context writes nothing")
	for err, want := range map[error]string{nil: StatusCompleted, fmt.Errorf("x: %w", context.Canceled): StatusCancelled,
		fmt.Errorf("x: %w", context.DeadlineExceeded): StatusTimedOut, fmt.Errorf("x"): StatusError} {
		require.Equal(t, want, StatusOf(err))
	}
}
