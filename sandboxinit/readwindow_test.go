package sandboxinit

import (
	"strings"
	"testing"

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
			res, err := readWindow([]byte(tc.file), api.FileReadArgs{Path: "f.txt", Offset: tc.offset, Limit: tc.limit, KeepFinalNewline: tc.keep})
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
	_, err := readWindow([]byte("caf\xe9\n"), api.FileReadArgs{Path: "blob.bin", Offset: 1, Limit: 10})
	require.Equal(t, api.KindInvalidRequest, api.AsError(err).Kind)
	require.Contains(t, err.Error(), "not valid UTF-8")

	wide := strings.Repeat("w", MaxReadOutputBytes+1)
	_, err = readWindow([]byte(wide+"\nshort\n"), api.FileReadArgs{Path: "wide.txt", Offset: 1, Limit: 10})
	require.Equal(t, api.KindInvalidRequest, api.AsError(err).Kind)
	require.Contains(t, err.Error(), "selected read output exceeds the maximum of 262144 bytes")
	res, err := readWindow([]byte(wide+"\nshort\n"), api.FileReadArgs{Path: "wide.txt", Offset: 2, Limit: 10})
	require.NoError(t, err, "a small window of the same file")
	require.Equal(t, "short", res.Content)
}
