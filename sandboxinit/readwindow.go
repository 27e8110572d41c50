package sandboxinit

import (
	"bytes"
	"strings"
	"unicode/utf8"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// readWindow is file_read's answer for the file bytes b: the text with its
// UTF-8 BOM stripped and CRLF read as LF, split into lines (a final newline
// ends the last line, it does not start another), and the window of
// a.Limit lines from line a.Offset (both already defaulted). total_bytes
// counts the file as stored; bytes_read the content returned. Text that is
// not UTF-8 and windows over MaxReadOutputBytes are refused.
func readWindow(b []byte, a api.FileReadArgs) (*api.FileReadResult, error) {
	total := int64(len(b))
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	if !utf8.Valid(b) {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path}, "file is not valid UTF-8")
	}
	text := strings.ReplaceAll(string(b), "\r\n", "\n")
	var lines []string // an empty file has no lines
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
		// The seed's content: the selected lines joined by "\n", no final
		// newline. keep_final_newline keeps the one that ends the last
		// selected line, so consecutive windows concatenate to the text.
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
