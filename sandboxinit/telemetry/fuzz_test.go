package telemetry

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzReverseLines: the backwards segment reader agrees with a forward
// split for any bytes and line cap.
func FuzzReverseLines(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc"), 2)
	f.Add(bytes.Repeat([]byte("x\n"), 40000), 1)
	f.Add(bytes.Repeat([]byte("y"), chunkBytes+3), 16)
	f.Fuzz(func(t *testing.T, data []byte, maxLine int) {
		if maxLine < 1 || maxLine > 4*chunkBytes {
			return
		}
		var got []string
		skipped, err := reverseLines(bytes.NewReader(data), int64(len(data)), maxLine, func(l []byte) bool {
			got = append(got, string(l))
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		want, wantSkipped := forwardLines(data, maxLine)
		if len(got) != len(want) || skipped != wantSkipped {
			t.Fatalf("got %d lines (%d skipped), want %d (%d)", len(got), skipped, len(want), wantSkipped)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("line %d: %q, want %q", i, got[i], want[i])
			}
		}
	})
}

// FuzzSegmentRecords: whatever a damaged segment holds, a query neither
// fails nor returns a record that does not parse, and stays within its caps.
func FuzzSegmentRecords(f *testing.F) {
	ev, _ := json.Marshal(&Event{Kind: KindEvent, TS: time.Unix(1700000000, 0).UTC(), Trace: "t", Name: "n", Attrs: map[string]any{}})
	f.Add(append(append([]byte{}, ev...), '\n'), "t")
	f.Add([]byte(`{"kind":"span","ts":"2024-01-01T00:00:00Z","trace":"t/x","span":"d-1"}`+"\n"+`{"kind":"event","ts":`), "t")
	f.Add([]byte("\x00\xff\n{}\n[]\nnull\n"), "")
	f.Fuzz(func(t *testing.T, data []byte, trace string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "events.ndjson.1"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "events.ndjson"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := OpenStream(dir, "events", 0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		res, err := s.Query(Query{Trace: trace})
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, r := range res.Records {
			if _, err := ParseHeader(r); err != nil {
				t.Fatalf("returned a record that does not parse: %q", r)
			}
			total += len(r)
		}
		if len(res.Records) > MaxRecords || total > MaxResponseBytes {
			t.Fatalf("caps exceeded: %d records, %d bytes", len(res.Records), total)
		}
		// Appending after damage yields a record a query finds first.
		s.Append(ev)
		res, err = s.Query(Query{Kind: KindEvent, Name: "n", Limit: 1})
		if err != nil || len(res.Records) != 1 || !bytes.Equal(res.Records[0], ev) {
			t.Fatalf("append after damage: %v %q", err, res.Records)
		}
	})
}
