package telemetry

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEncodeTruncatesOversizedAttrs(t *testing.T) {
	long := strings.Repeat("é", 20000) // multi-byte: cuts must stay valid UTF-8
	paths := make([]string, 2000)
	for i := range paths {
		paths[i] = strings.Repeat("p", 30) + "/" + strings.Repeat("q", i%50)
	}
	cases := []struct {
		name  string
		attrs map[string]any
		keep  []string // attrs kept whole
	}{
		{"long string", map[string]any{"cmd": long, "workspace_session_id": "ws-1"}, []string{"workspace_session_id"}},
		{"long list", map[string]any{"paths": paths, "path_count": len(paths)}, []string{"path_count"}},
		{"nested", map[string]any{"detail": map[string]any{"a": long, "b": 1}, "ok": true}, []string{"ok"}},
		{"many keys", func() map[string]any {
			m := map[string]any{}
			for i := 0; i < 3000; i++ {
				m[strings.Repeat("k", 8)+string(rune('a'+i%26))+strings.Repeat("0", i%7)+json.Number("1").String()+string(rune(i))] = i
			}
			return m
		}(), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := &Event{Kind: KindEvent, TS: time.Now().UTC(), Trace: "rid", Name: "x", Attrs: tc.attrs}
			b, err := Encode(ev)
			require.NoError(t, err)
			require.Less(t, len(b), MaxLineBytes)
			require.Greater(t, len(b), MaxLineBytes/2, "truncation keeps most of the budget")
			var got Event
			require.NoError(t, json.Unmarshal(b, &got), "a truncated record is valid JSON")
			require.Equal(t, true, got.Attrs["_truncated"])
			for _, k := range tc.keep {
				require.EqualValues(t, mustJSON(tc.attrs[k]), mustJSON(got.Attrs[k]), "small attr %s kept whole", k)
			}
			require.Equal(t, tc.attrs, ev.Attrs, "the caller's attrs are not changed")
		})
	}
	small := &Span{Kind: KindSpan, TS: time.Now().UTC(), Trace: "t", Span: "d-1", Name: "n", Status: StatusCompleted, Attrs: map[string]any{"a": 1}}
	b, err := Encode(small)
	require.NoError(t, err)
	require.NotContains(t, string(b), "_truncated")
	s := &Sample{TS: time.Now().UTC(), Scope: "sandbox", Metrics: map[string]any{"memory_bytes": 5}}
	b, err = Encode(s)
	require.NoError(t, err)
	h, err := ParseHeader(b)
	require.NoError(t, err)
	require.Equal(t, KindSample, h.Kind)
	require.Equal(t, "sandbox", h.Scope)
	require.Contains(t, string(b), `"memory_bytes":5`)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestParseHeaderRejects(t *testing.T) {
	for _, in := range []string{``, `null`, `[]`, `{"kind":"x","ts":"2024-01-01T00:00:00Z"}`, `{"kind":"event"}`, `{"kind":"event","ts":"yesterday"}`} {
		_, err := ParseHeader([]byte(in))
		require.Error(t, err, in)
	}
	_, err := ParseHeader([]byte(`{"kind":"event","ts":"2024-01-01T00:00:00Z","name":"a"}`))
	require.NoError(t, err)
}
