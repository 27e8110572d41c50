package layerstack

import (
	"bufio"
	"bytes"
	"io"
	"strconv"
)

// UnifiedDiff writes a git-style unified diff body of a -> b: only the
// "@@ -l,s +l,s @@" hunks with context lines of context (git uses 3), lines
// prefixed ' ', '-', '+', and "\ No newline at end of file" after a line that
// lacks its final newline. It writes nothing when a and b are equal. Line
// numbers/counts follow GNU diff conventions (e.g. "-0,0" for an empty side).
func UnifiedDiff(w io.Writer, a, b []byte, context int) error {
	if bytes.Equal(a, b) {
		return nil
	}
	context = max(context, 0)
	al, bl := splitLines(a), splitLines(b)
	hunks := diffLines(al, bl)
	bw := bufio.NewWriter(w)
	for len(hunks) > 0 {
		// Hunks whose gap fits in the shared context print as one.
		n := 1
		for n < len(hunks) && hunks[n].A0-hunks[n-1].A1 <= 2*context {
			n++
		}
		writeUnifiedHunk(bw, al, bl, hunks[:n], context)
		hunks = hunks[n:]
	}
	return bw.Flush()
}

// writeUnifiedHunk writes one "@@" hunk covering hs plus context. Write
// errors are sticky in bufio.Writer and surface at Flush.
func writeUnifiedHunk(w *bufio.Writer, a, b [][]byte, hs []diffHunk, context int) {
	first, last := hs[0], hs[len(hs)-1]
	a0 := max(first.A0-context, 0)
	a1 := min(last.A1+context, len(a))
	b0 := first.B0 - (first.A0 - a0)
	b1 := last.B1 + (a1 - last.A1)

	w.WriteString("@@ -")
	w.WriteString(unifiedRange(a0, a1-a0))
	w.WriteString(" +")
	w.WriteString(unifiedRange(b0, b1-b0))
	w.WriteString(" @@\n")

	cur := a0
	for _, h := range hs {
		writeUnifiedLines(w, ' ', a[cur:h.A0])
		writeUnifiedLines(w, '-', a[h.A0:h.A1])
		writeUnifiedLines(w, '+', b[h.B0:h.B1])
		cur = h.A1
	}
	writeUnifiedLines(w, ' ', a[cur:a1])
}

// unifiedRange formats a 0-based start and a count as GNU diff does: "l" for
// one line, "l,n" otherwise, and for an empty range the line before it.
func unifiedRange(start, count int) string {
	switch count {
	case 0:
		return strconv.Itoa(start) + ",0"
	case 1:
		return strconv.Itoa(start + 1)
	default:
		return strconv.Itoa(start+1) + "," + strconv.Itoa(count)
	}
}

func writeUnifiedLines(w *bufio.Writer, prefix byte, lines [][]byte) {
	for _, l := range lines {
		w.WriteByte(prefix)
		w.Write(l)
		if len(l) == 0 || l[len(l)-1] != '\n' {
			w.WriteString("\n\\ No newline at end of file\n")
		}
	}
}
