package telemetry

import (
	"testing"
)

// BenchmarkDispatchSpan is what every request pays: one span with an
// attribute, encoded and appended (no fsync).
func BenchmarkDispatchSpan(b *testing.B) {
	s, err := OpenStream(b.TempDir(), "events", DefaultEventBudget)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tr := NewTracer(s, "d", nil)
	ctx := WithTrace(b.Context(), "0123456789abcdef0123456789abcdef")
	b.ReportAllocs()
	for b.Loop() {
		_, sp := tr.Start(ctx, "daemon.dispatch", map[string]any{"op": "exec_command"})
		sp.End(nil)
	}
}

// BenchmarkQueryNewestEvents is the SSE poller's query against a full
// stream: nothing new since the last poll.
func BenchmarkQueryNewestEvents(b *testing.B) {
	s, err := OpenStream(b.TempDir(), "events", DefaultEventBudget)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tr := NewTracer(s, "d", nil)
	for s.Stats().Bytes < DefaultEventBudget*3/4 {
		tr.Event(WithTrace(b.Context(), "r"), "workspace_session.created", map[string]any{"workspace_session_id": "ws-0123456789ab"})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Query(Query{Kind: KindEvent, SinceMS: 1 << 62, Ordered: true}); err != nil {
			b.Fatal(err)
		}
	}
}
