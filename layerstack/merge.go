package layerstack

// Three-way line merge.
//
// Merge3 diffs base->head and base->ours (diffLines) and walks both hunk
// lists in base order. Hunks of the two sides that touch the same base lines
// are grouped, transitively, into regions; a region is taken cleanly when
// only one side changed it, or when both sides turn it into byte-identical
// text, and is a conflict otherwise.
//
// "Touching" is deliberately narrow. Two replacements conflict only if their
// base ranges share a line; an insertion conflicts with a replacement only if
// it lands strictly inside it; two insertions conflict only at the same point.
// Edits on adjacent lines (head changes line 3, ours line 4; an insertion
// right before or after the other side's deletion) therefore merge cleanly,
// unlike git, which also treats adjacency as a conflict. Layers are merged
// automatically with nobody to resolve markers, so every spurious conflict
// costs a user a manual step, while adjacent edits nearly always compose; the
// changed lines of each side survive untouched either way.
//
// A conflict never produces conflict markers: the result carries the
// conflicting regions as 1-based line ranges of base, head and ours, and no
// merged bytes at all. Callers decide what to do (keep one side, ask the
// user); writing a file that looks valid but holds "<<<<<<<" lines into a
// layer would silently break whatever reads it.
//
// Bytes are preserved exactly: lines keep their own terminators (CRLF, LF,
// mixed, or none on the last line), and merged output is a concatenation of
// whole lines taken from base, head or ours. The one adjacency that is not
// clean is an insertion at end of file next to a change of the other side
// that leaves its last line without a newline: gluing them would fuse two
// lines into one, so that pair is grouped (and usually conflicts).

import (
	"bytes"
	"unicode/utf8"
)

// LineRange is a 1-based line range: Start is the first line, Count the
// number of lines. Count 0 means an insertion point before line Start.
type LineRange struct {
	Start int `json:"start_line"`
	Count int `json:"line_count"`
}

// MergeConflict is one region where both sides changed the same base lines
// differently.
type MergeConflict struct {
	Base LineRange `json:"base"`
	Head LineRange `json:"head"`
	Ours LineRange `json:"ours"`
}

// MergeResult is the outcome of a three-way line merge. When Conflicts is
// empty, Merged holds the merged bytes.
type MergeResult struct {
	Merged    []byte
	Conflicts []MergeConflict
}

// MergeMaxBytes: files bigger than this (any of the three sides) are never
// merged (caller treats as conflict kind "too_large").
const MergeMaxBytes = 8 << 20

// IsText reports whether b can be line-merged: no NUL byte and valid UTF-8.
func IsText(b []byte) bool {
	return bytes.IndexByte(b, 0) < 0 && utf8.Valid(b)
}

// Merge3 merges the change base->head and the change base->ours at line
// granularity.
func Merge3(base, head, ours []byte) MergeResult {
	switch {
	case bytes.Equal(head, ours), bytes.Equal(base, ours):
		return MergeResult{Merged: append([]byte{}, head...)}
	case bytes.Equal(base, head):
		return MergeResult{Merged: append([]byte{}, ours...)}
	}
	return merge3(base, head, ours)
}

// merge3 is Merge3 without the shortcuts for unchanged sides.
func merge3(base, head, ours []byte) MergeResult {
	m := merger{base: splitLines(base)}
	m.head = newMergeSide(m.base, splitLines(head))
	m.ours = newMergeSide(m.base, splitLines(ours))

	out := make([]byte, 0, max(len(head), len(ours)))
	var conflicts []MergeConflict
	pos := 0
	for !m.head.done() || !m.ours.done() {
		g := m.nextGroup()
		out = appendLines(out, m.base[pos:g.lo])
		pos = g.hi
		text, conflict, ok := m.resolve(g)
		if ok {
			out = append(out, text...)
		} else {
			conflicts = append(conflicts, conflict)
		}
		m.head.consume(g.head)
		m.ours.consume(g.ours)
	}
	if len(conflicts) > 0 {
		return MergeResult{Conflicts: conflicts}
	}
	return MergeResult{Merged: appendLines(out, m.base[pos:])}
}

// mergeSide is one side's diff against base plus a cursor into it.
type mergeSide struct {
	base, lines [][]byte
	hunks       []diffHunk
	next        int // first hunk not yet merged
	delta       int // side lines minus base lines over merged hunks
}

func newMergeSide(base, lines [][]byte) *mergeSide {
	return &mergeSide{base: base, lines: lines, hunks: diffLines(base, lines)}
}

func (s *mergeSide) done() bool { return s.next == len(s.hunks) }

// span is a half-open range of hunk indexes.
type span struct{ lo, hi int }

func (sp span) empty() bool { return sp.lo == sp.hi }

func (s *mergeSide) consume(sp span) {
	for _, h := range s.hunks[sp.lo:sp.hi] {
		s.delta += (h.B1 - h.B0) - (h.A1 - h.A0)
	}
	s.next = sp.hi
}

// gluesAtEOF reports whether h rewrites the end of base into text whose last
// line has no newline, so nothing may be appended after it.
func (s *mergeSide) gluesAtEOF(h diffHunk) bool {
	if h.A1 != len(s.base) || h.B1 != len(s.lines) || h.B0 == h.B1 {
		return false
	}
	last := s.lines[h.B1-1]
	return last[len(last)-1] != '\n'
}

// render returns the side's text for base[lo:hi] with the hunks of sp applied.
func (s *mergeSide) render(sp span, lo, hi int) []byte {
	var out []byte
	for _, h := range s.hunks[sp.lo:sp.hi] {
		out = appendLines(out, s.base[lo:h.A0])
		out = appendLines(out, s.lines[h.B0:h.B1])
		lo = h.A1
	}
	return appendLines(out, s.base[lo:hi])
}

// lineRange returns the side's 1-based range covering base[lo:hi] after the
// hunks of sp.
func (s *mergeSide) lineRange(sp span, lo, hi int) LineRange {
	count := hi - lo
	for _, h := range s.hunks[sp.lo:sp.hi] {
		count += (h.B1 - h.B0) - (h.A1 - h.A0)
	}
	return LineRange{Start: lo + s.delta + 1, Count: count}
}

// merger walks the two sides' hunks in base order.
type merger struct {
	base       [][]byte
	head, ours *mergeSide
}

// group is a maximal set of mutually touching hunks from both sides,
// covering base[lo:hi].
type group struct {
	head, ours span
	lo, hi     int
}

// nextGroup collects the next group: it starts from the hunk that comes
// first in base order and pulls in every next hunk of either side that
// touches a hunk of the other side already in the group.
func (m *merger) nextGroup() group {
	h, o := m.head, m.ours
	g := group{head: span{h.next, h.next}, ours: span{o.next, o.next}}
	if m.headFirst() {
		g.head.hi++
	} else {
		g.ours.hi++
	}
	for {
		switch {
		case g.head.hi < len(h.hunks) && touchesAny(h, h.hunks[g.head.hi], o, g.ours):
			g.head.hi++
		case g.ours.hi < len(o.hunks) && touchesAny(o, o.hunks[g.ours.hi], h, g.head):
			g.ours.hi++
		default:
			g.lo, g.hi = g.bounds(h, o)
			return g
		}
	}
}

// headFirst reports whether the next head hunk comes before the next ours
// hunk in base order. At equal positions an insertion goes first (it ends up
// before the other side's replacement); any other tie touches and lands in
// one group, so the choice does not matter.
func (m *merger) headFirst() bool {
	h, o := m.head, m.ours
	switch {
	case h.done():
		return false
	case o.done():
		return true
	}
	hh, oh := h.hunks[h.next], o.hunks[o.next]
	if hh.A0 != oh.A0 {
		return hh.A0 < oh.A0
	}
	return hh.A0 == hh.A1
}

// bounds returns the base range covered by the group's hunks.
func (g group) bounds(h, o *mergeSide) (lo, hi int) {
	lo, hi = -1, -1
	if !g.head.empty() {
		lo, hi = h.hunks[g.head.lo].A0, h.hunks[g.head.hi-1].A1
	}
	if !g.ours.empty() {
		olo, ohi := o.hunks[g.ours.lo].A0, o.hunks[g.ours.hi-1].A1
		if lo < 0 || olo < lo {
			lo = olo
		}
		hi = max(hi, ohi)
	}
	return lo, hi
}

// touchesAny reports whether hunk x of side xs touches any hunk of side ys
// in sp. Hunks of one side are ordered and disjoint, so the scan runs
// backwards and stops at the first hunk that ends before x starts.
func touchesAny(xs *mergeSide, x diffHunk, ys *mergeSide, sp span) bool {
	for i := sp.hi - 1; i >= sp.lo; i-- {
		y := ys.hunks[i]
		if y.A1 < x.A0 {
			return false
		}
		if touches(xs, x, ys, y) {
			return true
		}
	}
	return false
}

// touches is the conflict relation between a hunk of one side and a hunk of
// the other (see the file comment). It is symmetric.
func touches(xs *mergeSide, x diffHunk, ys *mergeSide, y diffHunk) bool {
	xIns, yIns := x.A0 == x.A1, y.A0 == y.A1
	switch {
	case xIns && yIns:
		return x.A0 == y.A0
	case xIns:
		return insertionTouches(x.A0, ys, y)
	case yIns:
		return insertionTouches(y.A0, xs, x)
	default:
		return x.A0 < y.A1 && y.A0 < x.A1
	}
}

// insertionTouches reports whether an insertion at base point p touches the
// replacement r of side rs: p lies strictly inside it, or p is the end of
// file and r leaves the file without a final newline.
func insertionTouches(p int, rs *mergeSide, r diffHunk) bool {
	return (r.A0 < p && p < r.A1) || (p == r.A1 && rs.gluesAtEOF(r))
}

// resolve returns the group's merged text, or the conflict it represents.
func (m *merger) resolve(g group) ([]byte, MergeConflict, bool) {
	h, o := m.head, m.ours
	switch {
	case g.ours.empty():
		return h.render(g.head, g.lo, g.hi), MergeConflict{}, true
	case g.head.empty():
		return o.render(g.ours, g.lo, g.hi), MergeConflict{}, true
	}
	ht, ot := h.render(g.head, g.lo, g.hi), o.render(g.ours, g.lo, g.hi)
	if bytes.Equal(ht, ot) {
		return ht, MergeConflict{}, true
	}
	return nil, MergeConflict{
		Base: LineRange{Start: g.lo + 1, Count: g.hi - g.lo},
		Head: h.lineRange(g.head, g.lo, g.hi),
		Ours: o.lineRange(g.ours, g.lo, g.hi),
	}, false
}

func appendLines(dst []byte, lines [][]byte) []byte {
	for _, l := range lines {
		dst = append(dst, l...)
	}
	return dst
}
