package telemetry

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func line(i int, pad int) []byte {
	b, _ := json.Marshal(map[string]any{"kind": KindEvent, "ts": time.Unix(1700000000, 0).Add(time.Duration(i) * time.Millisecond).UTC(),
		"trace": "t", "name": "n", "attrs": map[string]any{"i": i, "pad": strings.Repeat("x", pad)}})
	return b
}

func segSizes(t *testing.T, s *Stream) (cur, prev int64) {
	t.Helper()
	if fi, err := os.Stat(s.current()); err == nil {
		cur = fi.Size()
	}
	if fi, err := os.Stat(s.previous()); err == nil {
		prev = fi.Size()
	}
	return cur, prev
}

// allLines returns every line of the stream, newest first.
func allLines(t *testing.T, s *Stream) [][]byte {
	t.Helper()
	segs, err := s.snapshot()
	require.NoError(t, err)
	defer closeSegments(segs)
	var out [][]byte
	for _, sg := range segs {
		_, err := reverseLines(sg.f, sg.size, MaxLineBytes, func(l []byte) bool { out = append(out, bytes.Clone(l)); return true })
		require.NoError(t, err)
	}
	return out
}

func TestStreamRotatesUnderBudget(t *testing.T) {
	const budget = 64 << 10
	s, err := OpenStream(t.TempDir(), "events", budget)
	require.NoError(t, err)
	defer s.Close()
	for i := 0; i < 2000; i++ {
		s.Append(line(i, i%300))
		cur, prev := segSizes(t, s)
		require.LessOrEqual(t, cur, int64(budget/2), "current segment within half the budget after append %d", i)
		require.LessOrEqual(t, prev, int64(budget/2), "previous segment within half the budget")
		require.LessOrEqual(t, cur+prev, int64(budget))
	}
	st := s.Stats()
	require.Greater(t, st.Rotations, uint64(5))
	require.Zero(t, st.Dropped)
	require.Equal(t, uint64(2000), st.Appended)
	lines := allLines(t, s)
	require.Contains(t, string(lines[0]), `"i":1999`, "the newest record is kept")
	var h struct {
		Attrs struct{ I int } `json:"attrs"`
	}
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &h))
	require.Greater(t, h.Attrs.I, 0, "the oldest records went with a rotation")
	// At least the newest half of the budget survives a rotation.
	var kept int
	for _, l := range lines {
		kept += len(l) + 1
	}
	require.GreaterOrEqual(t, kept, budget/2-MaxLineBytes)
	for i := 1; i < len(lines); i++ {
		require.NoError(t, json.Unmarshal(lines[i], &h))
		n := h.Attrs.I
		require.NoError(t, json.Unmarshal(lines[i-1], &h))
		require.Equal(t, n+1, h.Attrs.I, "lines come newest first without gaps")
	}
}

func TestStreamLineCap(t *testing.T) {
	s, err := OpenStream(t.TempDir(), "events", 0)
	require.NoError(t, err)
	defer s.Close()
	s.Append(bytes.Repeat([]byte("x"), MaxLineBytes)) // with its newline one byte over
	s.Append(bytes.Repeat([]byte("y"), MaxLineBytes-1))
	st := s.Stats()
	require.Equal(t, uint64(1), st.Oversize)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(1), st.Appended)
	require.Equal(t, int64(MaxLineBytes), st.Bytes)
	require.Equal(t, int64(2*MinBudget/2), st.BudgetBytes, "the budget is raised to the minimum")
}

func TestStreamSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStream(dir, "events", 0)
	require.NoError(t, err)
	for i := 0; i < 10; i++ {
		s.Append(line(i, 10))
	}
	require.NoError(t, s.Close())

	s, err = OpenStream(dir, "events", 0)
	require.NoError(t, err)
	require.Len(t, allLines(t, s), 10, "records persist across a reopen")
	s.Append(line(10, 10))
	lines := allLines(t, s)
	require.Len(t, lines, 11)
	require.Contains(t, string(lines[0]), `"i":10`)
	require.NoError(t, s.Close())

	// A crash mid-append leaves a partial line: the next append starts a
	// new segment instead of extending it.
	f, err := os.OpenFile(filepath.Join(dir, "events.ndjson"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte(`{"kind":"event","ts":"2024`))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	s, err = OpenStream(dir, "events", 0)
	require.NoError(t, err)
	defer s.Close()
	s.Append(line(11, 10))
	res, err := s.Query(Query{Kind: KindEvent})
	require.NoError(t, err)
	require.Len(t, res.Records, 12, "every whole record is still found")
	require.Equal(t, 1, res.Skipped, "the partial line is skipped")
	require.Contains(t, string(res.Records[0]), `"i":11`)
}

func TestStreamDropCounters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "obs")
	s, err := OpenStream(dir, "events", 0)
	require.NoError(t, err)
	defer s.Close()
	// The directory turns into a file: every append fails, none panics or
	// reports an error to its caller.
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.WriteFile(dir, nil, 0o600))
	for i := 0; i < 3; i++ {
		s.Append(line(i, 1))
	}
	st := s.Stats()
	require.Equal(t, uint64(3), st.Dropped)
	require.Zero(t, st.Appended)
	require.NotEmpty(t, st.LastError)

	tr := NewTracer(s, "d", nil)
	tr.Event(WithTrace(t.Context(), "r"), "x", map[string]any{"bad": make(chan int)}) // cannot be encoded
	require.Equal(t, uint64(4), s.Stats().Dropped)
}

func TestStreamConcurrentWriters(t *testing.T) {
	s, err := OpenStream(t.TempDir(), "events", 64<<20)
	require.NoError(t, err)
	defer s.Close()
	var wg sync.WaitGroup
	const writers, each = 8, 400
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := NewTracer(s, fmt.Sprintf("w%d", w), nil)
			for i := 0; i < each; i++ {
				tr.Event(WithTrace(t.Context(), fmt.Sprintf("w%d", w)), "e", map[string]any{"i": i, "pad": strings.Repeat("z", i%200)})
			}
		}()
	}
	// Readers run alongside and only ever see whole records.
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	rwg.Add(1)
	go func() {
		defer rwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := s.Query(Query{})
			if err != nil || res.Skipped != 0 {
				t.Errorf("query during writes: %v, %d skipped", err, res.Skipped)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	rwg.Wait()
	lines := allLines(t, s)
	require.Len(t, lines, writers*each)
	for _, l := range lines {
		_, err := ParseHeader(l)
		require.NoError(t, err, "%s", l)
	}
}

// A full disk drops records, never leaves a partial line behind, and the
// stream carries on once there is room again.
func TestStreamFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("this test mounts a small tmpfs to fill it: run it as root (make test does)")
	}
	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"), "mount a 64 KiB tmpfs")
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	filler := filepath.Join(dir, "filler")
	require.NoError(t, os.WriteFile(filler, bytes.Repeat([]byte("f"), 32<<10), 0o600))
	s, err := OpenStream(dir, "events", 4<<20) // a budget larger than the disk
	require.NoError(t, err)
	defer s.Close()
	for i := 0; i < 400; i++ {
		s.Append(line(i, 500))
	}
	st := s.Stats()
	require.Greater(t, st.Dropped, uint64(0), "the disk filled up")
	require.Greater(t, st.Appended, uint64(0))
	res, err := s.Query(Query{Limit: MaxRecords})
	require.NoError(t, err)
	require.Zero(t, res.Skipped, "no partial line on disk")
	require.Equal(t, int(st.Appended), len(res.Records))

	// Room again: appends succeed, after the last whole record.
	require.NoError(t, os.Remove(filler))
	s.Append(line(1000, 1))
	require.Equal(t, st.Appended+1, s.Stats().Appended)
	res, err = s.Query(Query{Limit: 1})
	require.NoError(t, err)
	require.Contains(t, string(res.Records[0]), `"i":1000`)
	require.Zero(t, res.Skipped)
}
