package sandboxinit

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// TestReadWindow: file_read's content is the seed's — the selected lines
// joined by "\n" without a final newline, BOM stripped and CRLF normalised
// before windowing — unless keep_final_newline asks for the newline that
// ends the last selected line.
func TestReadWindow(t *testing.T) {
	seven := strings.Join([]string{"line-1", "line-2", "line-3", "line-4", "line-5", "line-6", "line-7"}, "\n")
	next := func(n int) *int { return &n }
	for _, tc := range []struct {
		name            string
		file            string
		offset, limit   int
		keep            bool
		content         string
		start, num, tot int
		next            *int
		bytesRead       int
		totalBytes      int64
	}{
		{name: "window of lines 3-4", file: seven, offset: 3, limit: 2, content: "line-3\nline-4", start: 3, num: 2, tot: 7, next: next(5), bytesRead: 13, totalBytes: 48},
		{name: "whole file with a final newline", file: "a\nb\nc\n", offset: 1, limit: 2000, content: "a\nb\nc", start: 1, num: 3, tot: 3, bytesRead: 5, totalBytes: 6},
		{name: "kept final newline", file: "a\nb\nc\n", offset: 1, limit: 2000, keep: true, content: "a\nb\nc\n", start: 1, num: 3, tot: 3, bytesRead: 6, totalBytes: 6},
		{name: "kept newline inside the file", file: seven, offset: 3, limit: 2, keep: true, content: "line-3\nline-4\n", start: 3, num: 2, tot: 7, next: next(5), bytesRead: 14, totalBytes: 48},
		{name: "kept, last line without one", file: "a\nb", offset: 1, limit: 2000, keep: true, content: "a\nb", start: 1, num: 2, tot: 2, bytesRead: 3, totalBytes: 3},
		{name: "BOM and CRLF before windowing", file: "\xef\xbb\xbfline1\r\nline2\r\n", offset: 1, limit: 2000, content: "line1\nline2", start: 1, num: 2, tot: 2, bytesRead: 11, totalBytes: 17},
		{name: "CRLF window", file: "x\r\ny\r\nz\r\n", offset: 2, limit: 1, content: "y", start: 2, num: 1, tot: 3, next: next(3), bytesRead: 1, totalBytes: 9},
		{name: "past the end is an empty window", file: "a\nb\n", offset: 9, limit: 5, content: "", start: 9, num: 0, tot: 2, bytesRead: 0, totalBytes: 4},
		{name: "empty file", file: "", offset: 1, limit: 2000, content: "", start: 1, num: 0, tot: 0, bytesRead: 0, totalBytes: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := readWindow(strings.NewReader(tc.file), api.FileReadArgs{Path: "f.txt", Offset: tc.offset, Limit: tc.limit, KeepFinalNewline: tc.keep})
			require.NoError(t, err)
			require.Equal(t, tc.content, res.Content)
			require.Equal(t, tc.start, res.StartLine)
			require.Equal(t, tc.num, res.NumLines)
			require.Equal(t, tc.tot, res.TotalLines)
			require.Equal(t, tc.next, res.NextOffset)
			require.Equal(t, tc.next != nil, res.Truncated)
			require.Equal(t, tc.bytesRead, res.BytesRead)
			require.Equal(t, tc.totalBytes, res.TotalBytes)
		})
	}
}

// TestReadWindowRefuses: text that is not UTF-8 and a window over the
// output cap are invalid_request.
func TestReadWindowRefuses(t *testing.T) {
	_, err := readWindow(strings.NewReader("caf\xe9\n"), api.FileReadArgs{Path: "blob.bin", Offset: 1, Limit: 10})
	require.Equal(t, api.KindInvalidRequest, api.AsError(err).Kind)
	require.Contains(t, err.Error(), "not valid UTF-8")

	wide := strings.Repeat("w", MaxReadOutputBytes+1)
	_, err = readWindow(strings.NewReader(wide+"\nshort\n"), api.FileReadArgs{Path: "wide.txt", Offset: 1, Limit: 10})
	require.Equal(t, api.KindInvalidRequest, api.AsError(err).Kind)
	require.Contains(t, err.Error(), "selected read output exceeds the maximum of 262144 bytes")
	res, err := readWindow(strings.NewReader(wide+"\nshort\n"), api.FileReadArgs{Path: "wide.txt", Offset: 2, Limit: 10})
	require.NoError(t, err, "a small window of the same file")
	require.Equal(t, "short", res.Content)
}

// readWindowWhole is readWindow as it was before it streamed: the whole
// file in memory, split into every line. The streaming one must answer
// exactly as it does.
func readWindowWhole(b []byte, a api.FileReadArgs) (*api.FileReadResult, error) {
	total := int64(len(b))
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	if !utf8.Valid(b) {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path}, "file is not valid UTF-8")
	}
	text := strings.ReplaceAll(string(b), "\r\n", "\n")
	var lines []string
	if text != "" {
		lines = strings.Split(text, "\n")
	}
	if strings.HasSuffix(text, "\n") {
		lines = lines[:len(lines)-1]
	}
	res := &api.FileReadResult{Path: a.Path, StartLine: a.Offset, TotalLines: len(lines), TotalBytes: total}
	if a.Offset-1 < len(lines) {
		end := min(len(lines), a.Offset-1+a.Limit)
		win := lines[a.Offset-1 : end]
		res.Content = strings.Join(win, "\n")
		if a.KeepFinalNewline && len(win) > 0 && (end < len(lines) || strings.HasSuffix(text, "\n")) {
			res.Content += "\n"
		}
		res.NumLines = len(win)
		if end < len(lines) {
			next := end + 1
			res.NextOffset, res.Truncated = &next, true
		}
	}
	if len(res.Content) > MaxReadOutputBytes {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path, "limit_bytes": MaxReadOutputBytes, "selected_bytes": len(res.Content)},
			"selected read output exceeds the maximum of %d bytes; read a smaller window with offset and limit", MaxReadOutputBytes)
	}
	res.BytesRead = len(res.Content)
	return res, nil
}

// TestReadWindowStreamsAsWhole: the streamed window is the one the whole
// file gave, at the start, middle and end of files whose lines are longer
// than what the reader holds at a time, with multi-byte characters, CRLFs
// and invalid bytes across its chunk boundaries, read in pieces of any size.
func TestReadWindowStreamsAsWhole(t *testing.T) {
	long := func(prefix int, tail string) string { return strings.Repeat("x", prefix) + tail }
	files := map[string]string{
		"empty":                   "",
		"bom only":                "\xef\xbb\xbf",
		"newlines":                strings.Repeat("\n", 5000),
		"no final newline":        "a\nb\nc",
		"crlf":                    strings.Repeat("row\r\n", 3000),
		"lone cr":                 "a\rb\r\r\nc\r",
		"cr at the end":           "a\nb\r",
		"euro across a chunk":     long(readChunk-1, "€€\n") + long(readChunk-2, "€\r\n") + "end",
		"cr across a chunk":       long(readChunk-1, "\r\nnext\n") + long(2*readChunk-1, "\r\n"),
		"emoji across chunks":     long(readChunk-3, "😀") + long(readChunk-2, "😀😀\n") + "z\n",
		"bad byte across chunk":   long(readChunk-1, "\xe2\n€\n"),
		"cut sequence at end":     "ok\n\xe2\x82",
		"bad byte in last line":   strings.Repeat("line\n", 100) + "caf\xe9",
		"bom and long lines":      "\xef\xbb\xbf" + long(3*readChunk, "\n") + strings.Repeat("short line\n", 3000),
		"wide window":             strings.Repeat(long(1000, "\n"), 300),
		"many lines, long last":   strings.Repeat("l\n", 4000) + long(readChunk+7, ""),
		"four-byte at the cut":    long(readChunk-2, "\xf0\x9f\x98\x80\n"),
		"newline as continuation": long(readChunk-1, "\xf0\x9f\n\x98\x80\n"),
	}
	windows := []struct{ offset, limit int }{{1, 1}, {1, 2000}, {2, 3}, {150, 10}, {1500, 2000}, {2999, 2}, {3000, 2000}, {4001, 1}, {5000, 1}, {5001, 1}, {9000, 5}}
	readers := map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"halves":   func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
	}
	for name, file := range files {
		for _, w := range windows {
			for _, keep := range []bool{false, true} {
				a := api.FileReadArgs{Path: "f.txt", Offset: w.offset, Limit: w.limit, KeepFinalNewline: keep}
				want, wantErr := readWindowWhole([]byte(file), a)
				for rn, reader := range readers {
					if rn == "one byte" && len(file) > 1<<16 {
						continue // slow, and the chunk boundaries are the point
					}
					got, err := readWindow(reader(file), a)
					require.Equal(t, wantErr, err, "%s, %s, %+v", name, rn, w)
					require.Equal(t, want, got, "%s, %s, %+v, keep %v", name, rn, w, keep)
				}
			}
		}
	}
}

// TestFileReadMemoryIsBounded: a few lines of a 32 MiB file of newlines
// cost the daemon a chunk and the window, not the file nor a slice of its
// lines (the whole-file read allocated about 20 times the file).
func TestFileReadMemoryIsBounded(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-read", nil)
	require.NoError(t, os.WriteFile(filepath.Join(s.merged(), "nl.txt"), bytes.Repeat([]byte("\n"), 32<<20), 0o644))
	for _, tc := range []struct {
		offset int
		next   *int
	}{{1, ptr(2)}, {16 << 20, ptr(16<<20 + 1)}, {32 << 20, nil}} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		res, err := d.fileRead(api.FileReadArgs{WorkspaceSessionID: "ws-read", Path: "nl.txt", Offset: tc.offset, Limit: 1})
		runtime.ReadMemStats(&after)
		require.NoError(t, err)
		require.Equal(t, &api.FileReadResult{Path: "nl.txt", StartLine: tc.offset, NumLines: 1, TotalLines: 32 << 20, TotalBytes: 32 << 20,
			NextOffset: tc.next, Truncated: tc.next != nil}, res)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "allocated %d bytes to read one line", after.TotalAlloc-before.TotalAlloc)
	}
}

// TestFileReadWithoutSession: the head's file is streamed the same way.
func TestFileReadWithoutSession(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10, "dir/g.txt": "g\n"})
	res, err := d.fileRead(api.FileReadArgs{Path: "f.txt", Offset: 9, Limit: 5, KeepFinalNewline: true})
	require.NoError(t, err)
	require.Equal(t, &api.FileReadResult{Path: "f.txt", Content: "9\n10\n", StartLine: 9, NumLines: 2, TotalLines: 10, TotalBytes: 21, BytesRead: 5}, res)
	_, err = d.fileRead(api.FileReadArgs{Path: "dir"})
	requireKind(t, err, api.KindInvalidRequest)
	_, err = d.fileRead(api.FileReadArgs{Path: "missing.txt"})
	requireKind(t, err, api.KindNotFound)
}

func ptr[T any](v T) *T { return &v }
