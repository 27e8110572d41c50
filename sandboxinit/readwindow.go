package sandboxinit

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math"
	"unicode/utf8"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// readChunk is how much of a file readWindow holds at a time: a file_read
// of a few lines costs this plus the window, whatever the file's size.
const readChunk = 64 << 10

// readWindow is file_read's answer for the file read from r: the text with
// its UTF-8 BOM stripped and CRLF read as LF, split into lines (a final
// newline ends the last line, it does not start another), and the window
// of a.Limit lines from line a.Offset (both already defaulted). total_bytes
// counts the file as stored; bytes_read the content returned. Text that is
// not UTF-8 and windows over MaxReadOutputBytes are refused.
//
// The file is streamed: every line is counted and checked, only the
// window's are kept (and of those no more than the output cap).
func readWindow(r io.Reader, a api.FileReadArgs) (*api.FileReadResult, error) {
	first := a.Offset - 1
	stop := first + a.Limit
	if stop < first {
		stop = math.MaxInt
	}
	w := &lineWindow{first: first, stop: stop, valid: true}
	total, err := w.scan(r)
	if err != nil {
		return nil, err
	}
	if !w.valid {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path}, "file is not valid UTF-8")
	}
	res := &api.FileReadResult{Path: a.Path, StartLine: a.Offset, TotalLines: w.lines, TotalBytes: total}
	if first < w.lines {
		end := min(w.lines, stop)
		// The seed's content: the selected lines joined by "\n", no final
		// newline. keep_final_newline keeps the one that ends the last
		// selected line, so consecutive windows concatenate to the text.
		if a.KeepFinalNewline && w.num > 0 && (end < w.lines || w.finalNewline) {
			w.put([]byte("\n"))
		}
		res.NumLines = w.num
		if end < w.lines {
			next := end + 1
			res.NextOffset, res.Truncated = &next, true
		}
	}
	if w.selected > MaxReadOutputBytes {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path, "limit_bytes": MaxReadOutputBytes, "selected_bytes": w.selected},
			"selected read output exceeds the maximum of %d bytes; read a smaller window with offset and limit", MaxReadOutputBytes)
	}
	res.Content = string(w.content)
	res.BytesRead = len(res.Content)
	return res, nil
}

// lineWindow collects the lines [first, stop) (0-based) of a text given
// piece by piece, and counts and checks all of them.
type lineWindow struct {
	first, stop  int
	lines        int  // lines ended so far
	open         bool // the current line has text
	started      bool // the current line is in the window and joined to it
	num          int  // window lines ended so far
	content      []byte
	selected     int // the window's bytes; content keeps no more than the cap
	valid        bool
	finalNewline bool // the last line ended with "\n"
}

// scan reads r to its end, line by line, and says how many bytes it had.
func (w *lineWindow) scan(r io.Reader) (int64, error) {
	br := bufio.NewReaderSize(r, readChunk)
	var total int64
	if bom, _ := br.Peek(3); bytes.Equal(bom, []byte("\xef\xbb\xbf")) {
		n, _ := br.Discard(3)
		total += int64(n)
	}
	// held is the end of a piece of a line held back for the next one: an
	// incomplete UTF-8 sequence, or a "\r" that may start a CRLF.
	var held, joined []byte
	for {
		piece, err := br.ReadSlice('\n')
		total += int64(len(piece))
		if len(held) > 0 {
			joined = append(append(joined[:0], held...), piece...)
			piece, held = joined, held[:0]
		}
		switch {
		case err == nil:
			w.text(bytes.TrimSuffix(piece[:len(piece)-1], []byte("\r")))
			w.endLine(true)
		case errors.Is(err, bufio.ErrBufferFull):
			cut := pieceCut(piece)
			w.text(piece[:cut])
			held = append(held, piece[cut:]...)
		case errors.Is(err, io.EOF):
			w.text(piece)
			if w.open {
				w.endLine(false)
			}
			return total, nil
		default:
			return total, err
		}
	}
}

// pieceCut is where a piece of a longer line can be cut: before a final
// "\r" (it may start a CRLF) or an incomplete UTF-8 sequence. Both cuts are
// before a byte that starts a character, so the parts are valid UTF-8
// exactly when the whole is.
func pieceCut(b []byte) int {
	n := len(b)
	if n > 0 && b[n-1] == '\r' {
		return n - 1
	}
	for i := n - 1; i >= 0 && i >= n-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return n
}

func (w *lineWindow) inWindow() bool { return w.lines >= w.first && w.lines < w.stop }

// text adds b to the current line.
func (w *lineWindow) text(b []byte) {
	if len(b) == 0 {
		return
	}
	w.open = true
	if w.valid && !utf8.Valid(b) {
		w.valid = false
	}
	if w.inWindow() {
		w.join()
		w.put(b)
	}
}

// endLine ends the current line; newline says a "\n" ended it.
func (w *lineWindow) endLine(newline bool) {
	if w.inWindow() {
		w.join()
		w.num++
	}
	w.lines++
	w.open, w.started, w.finalNewline = false, false, newline
}

// join starts the current line in the window: after a "\n" unless it is the
// window's first.
func (w *lineWindow) join() {
	if w.started {
		return
	}
	w.started = true
	if w.num > 0 {
		w.put([]byte("\n"))
	}
}

// put appends b to the window's content, keeping no more than the cap plus
// one byte: beyond it only the count matters (the read is refused).
func (w *lineWindow) put(b []byte) {
	w.selected += len(b)
	if room := MaxReadOutputBytes + 1 - len(w.content); room > 0 {
		w.content = append(w.content, b[:min(len(b), room)]...)
	}
}
