package layerstack

import (
	"bytes"
	"hash/maphash"
	"math"
)

// splitLines splits b into lines, each keeping its terminator ("\n"; a "\r\n"
// stays whole in its line), so joining the lines gives b back byte for byte.
// A missing final newline leaves a last line without terminator. Empty input
// gives zero lines.
//
// The returned lines alias b; their capacity is clipped so appending to one
// never overwrites the next.
func splitLines(b []byte) [][]byte {
	if len(b) == 0 {
		return nil
	}
	n := bytes.Count(b, []byte{'\n'})
	if b[len(b)-1] != '\n' {
		n++
	}
	lines := make([][]byte, 0, n)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			lines = append(lines, b)
			break
		}
		lines = append(lines, b[:i+1:i+1])
		b = b[i+1:]
	}
	return lines
}

// diffHunk says a[A0:A1] is replaced by b[B0:B1] (0-based, half-open). An
// insertion has A0==A1, a deletion B0==B1.
type diffHunk struct{ A0, A1, B0, B1 int }

// diffLines returns the hunks turning a into b: ordered, non-overlapping,
// separated by at least one unchanged line, and minimal (Myers' O(ND)
// algorithm in its linear-space, middle-snake divide-and-conquer form, so
// memory stays O(N+M)).
//
// The common prefix and suffix are stripped first; the rest is interned to
// ints, and lines that occur on one side only are set aside (they can never
// be matched, so removing them keeps the result minimal while making wholly
// diverged inputs cheap). Only if a middle-snake search runs past its cost
// limit (see diffCostBudget) does it fall back to GNU diff's heuristic split,
// which keeps pathological inputs (hundreds of thousands of lines drawn from
// a tiny alphabet) fast at the price of a possibly non-minimal, but always
// correct, result.
func diffLines(a, b [][]byte) []diffHunk {
	lo := 0
	for lo < len(a) && lo < len(b) && bytes.Equal(a[lo], b[lo]) {
		lo++
	}
	ahi, bhi := len(a), len(b)
	for ahi > lo && bhi > lo && bytes.Equal(a[ahi-1], b[bhi-1]) {
		ahi--
		bhi--
	}
	ca, cb := make([]bool, len(a)), make([]bool, len(b))
	if lo < ahi || lo < bhi {
		ia, ib := internLines(a[lo:ahi], b[lo:bhi])
		diffMiddle(ia, ib, ca[lo:ahi], cb[lo:bhi])
	}
	return buildHunks(ca, cb)
}

// internLines maps every line of a and b to a small int id; equal ids mean
// byte-identical lines. It uses an open-addressing table keyed by line hash,
// comparing bytes on a hash match, so lines are neither copied nor converted
// to strings.
func internLines(a, b [][]byte) (ia, ib []int32) {
	n := len(a) + len(b)
	size := 16
	for size < 2*n {
		size <<= 1
	}
	t := lineTable{
		a: a, b: b,
		seed:   maphash.MakeSeed(),
		slots:  make([]int32, size),
		mask:   uint64(size - 1),
		hashes: make([]uint64, 0, n),
		reps:   make([]int32, 0, n),
	}
	ia, ib = make([]int32, len(a)), make([]int32, len(b))
	for i := range a {
		ia[i] = t.intern(int32(i))
	}
	for i := range b {
		ib[i] = t.intern(int32(len(a) + i))
	}
	return ia, ib
}

// lineTable is the interning hash table. Lines are named by position: p <
// len(a) is a[p], otherwise b[p-len(a)]. slots hold id+1 (0 is empty); each
// id has the hash and position of its first line.
type lineTable struct {
	a, b   [][]byte
	seed   maphash.Seed
	slots  []int32
	mask   uint64
	hashes []uint64
	reps   []int32
}

func (t *lineTable) line(p int32) []byte {
	if int(p) < len(t.a) {
		return t.a[p]
	}
	return t.b[int(p)-len(t.a)]
}

func (t *lineTable) intern(p int32) int32 {
	l := t.line(p)
	h := maphash.Bytes(t.seed, l)
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s == 0 {
			id := int32(len(t.reps))
			t.slots[i] = id + 1
			t.hashes = append(t.hashes, h)
			t.reps = append(t.reps, p)
			return id
		}
		if id := s - 1; t.hashes[id] == h && bytes.Equal(t.line(t.reps[id]), l) {
			return id
		}
	}
}

// diffMiddle marks in ca/cb the lines of a/b that are not part of a longest
// common subsequence. Lines present on one side only are marked up front and
// the search runs on the remaining lines.
func diffMiddle(a, b []int32, ca, cb []bool) {
	if len(a) == 0 || len(b) == 0 {
		markAll(ca)
		markAll(cb)
		return
	}
	inA, inB := idSet(a), idSet(b)
	fa, mapA := keepShared(a, inB, ca)
	fb, mapB := keepShared(b, inA, cb)
	fca, fcb := make([]bool, len(fa)), make([]bool, len(fb))
	if len(fa) > 0 && len(fb) > 0 {
		newMyers(fa, fb, fca, fcb).compare(0, len(fa), 0, len(fb))
	} else {
		markAll(fca)
		markAll(fcb)
	}
	for i, c := range fca {
		ca[mapA[i]] = c
	}
	for i, c := range fcb {
		cb[mapB[i]] = c
	}
}

func markAll(c []bool) {
	for i := range c {
		c[i] = true
	}
}

// idSet returns a membership table indexed by line id.
func idSet(ids []int32) []bool {
	var top int32
	for _, id := range ids {
		top = max(top, id)
	}
	set := make([]bool, top+1)
	for _, id := range ids {
		set[id] = true
	}
	return set
}

// keepShared returns the ids of s that also occur on the other side, with
// their original indexes; the others are marked changed in c.
func keepShared(s []int32, other []bool, c []bool) (kept, index []int32) {
	kept = make([]int32, 0, len(s))
	index = make([]int32, 0, len(s))
	for i, id := range s {
		if int(id) < len(other) && other[id] {
			kept = append(kept, id)
			index = append(index, int32(i))
		} else {
			c[i] = true
		}
	}
	return kept, index
}

// buildHunks turns per-line change marks into hunks. Unchanged lines of a and
// b pair up in order.
func buildHunks(ca, cb []bool) []diffHunk {
	var hunks []diffHunk
	i, j := 0, 0
	for i < len(ca) || j < len(cb) {
		if i < len(ca) && j < len(cb) && !ca[i] && !cb[j] {
			i++
			j++
			continue
		}
		h := diffHunk{A0: i, B0: j}
		for i < len(ca) && ca[i] {
			i++
		}
		for j < len(cb) && cb[j] {
			j++
		}
		h.A1, h.B1 = i, j
		if h.A0 == h.A1 && h.B0 == h.B1 {
			panic("layerstack: inconsistent line diff")
		}
		hunks = append(hunks, h)
	}
	return hunks
}

// diffCostBudget bounds the work of one diff. With N+M lines left to compare
// after stripping, every middle-snake search gives up after
// diffCostBudget/(N+M) edit steps (never fewer than diffMinCost) and settles
// for a heuristic split point. Myers' search costs about (N+M)·D, so this
// keeps the worst case near a fixed amount of work whatever the input size,
// while results stay exact whenever each sub-problem has fewer than about
// 2·diffCostBudget/(N+M) differences: ~13k for two 10k-line files, ~650 for
// two 200k-line files. Variables only so tests can force the fallback.
var (
	diffCostBudget = 1 << 27
	diffMinCost    = 256
)

// myers is the linear-space Myers diff over interned lines. fd and bd are the
// forward and backward furthest-reaching x per diagonal k = x-y, indexed by
// k+off, shared by all recursive calls.
type myers struct {
	a, b   []int32
	ca, cb []bool
	fd, bd []int
	off    int
	limit  int
}

func newMyers(a, b []int32, ca, cb []bool) *myers {
	n := len(a) + len(b) + 3
	return &myers{
		a: a, b: b, ca: ca, cb: cb,
		fd: make([]int, n), bd: make([]int, n),
		off:   len(b) + 1,
		limit: max(diffMinCost, diffCostBudget/(len(a)+len(b))),
	}
}

// compare marks the changed lines of a[xlo:xhi] against b[ylo:yhi].
func (m *myers) compare(xlo, xhi, ylo, yhi int) {
	for xlo < xhi && ylo < yhi && m.a[xlo] == m.b[ylo] {
		xlo++
		ylo++
	}
	for xlo < xhi && ylo < yhi && m.a[xhi-1] == m.b[yhi-1] {
		xhi--
		yhi--
	}
	switch {
	case xlo == xhi:
		markAll(m.cb[ylo:yhi])
	case ylo == yhi:
		markAll(m.ca[xlo:xhi])
	default:
		x, y := m.split(xlo, xhi, ylo, yhi)
		if (x == xlo && y == ylo) || (x == xhi && y == yhi) ||
			x < xlo || x > xhi || y < ylo || y > yhi {
			// No progress possible (cannot happen for the exact
			// search); give up on this box rather than recurse forever.
			markAll(m.ca[xlo:xhi])
			markAll(m.cb[ylo:yhi])
			return
		}
		m.compare(xlo, x, ylo, y)
		m.compare(x, xhi, y, yhi)
	}
}

// split finds the middle snake of the box and returns a point on it; the
// optimal edit script passes through that point. This follows GNU diff's
// diag() closely.
func (m *myers) split(xoff, xlim, yoff, ylim int) (int, int) {
	a, b, fd, bd, o := m.a, m.b, m.fd, m.bd, m.off
	dmin, dmax := xoff-ylim, xlim-yoff
	fmid, bmid := xoff-yoff, xlim-ylim
	fmin, fmax, bmin, bmax := fmid, fmid, bmid, bmid
	odd := (fmid-bmid)&1 != 0
	fd[o+fmid] = xoff
	bd[o+bmid] = xlim
	for c := 1; ; c++ {
		// Extend the forward search by one edit step on each diagonal.
		if fmin > dmin {
			fmin--
			fd[o+fmin-1] = -1
		} else {
			fmin++
		}
		if fmax < dmax {
			fmax++
			fd[o+fmax+1] = -1
		} else {
			fmax--
		}
		for d := fmax; d >= fmin; d -= 2 {
			tlo, thi := fd[o+d-1], fd[o+d+1]
			x := thi
			if tlo >= thi {
				x = tlo + 1
			}
			y := x - d
			for x < xlim && y < ylim && a[x] == b[y] {
				x++
				y++
			}
			fd[o+d] = x
			if odd && bmin <= d && d <= bmax && bd[o+d] <= x {
				return x, y
			}
		}

		// Likewise extend the backward search.
		if bmin > dmin {
			bmin--
			bd[o+bmin-1] = math.MaxInt
		} else {
			bmin++
		}
		if bmax < dmax {
			bmax++
			bd[o+bmax+1] = math.MaxInt
		} else {
			bmax--
		}
		for d := bmax; d >= bmin; d -= 2 {
			tlo, thi := bd[o+d-1], bd[o+d+1]
			x := tlo
			if tlo >= thi {
				x = thi - 1
			}
			y := x - d
			for x > xoff && y > yoff && a[x-1] == b[y-1] {
				x--
				y--
			}
			bd[o+d] = x
			if !odd && fmin <= d && d <= fmax && x <= fd[o+d] {
				return x, y
			}
		}

		if c >= m.limit {
			return m.heuristicSplit(xoff, xlim, yoff, ylim, fmin, fmax, bmin, bmax)
		}
	}
}

// heuristicSplit gives up on finding the middle snake and returns the point
// that got furthest, forward or backward, as GNU diff does when a search
// becomes too expensive.
func (m *myers) heuristicSplit(xoff, xlim, yoff, ylim, fmin, fmax, bmin, bmax int) (int, int) {
	fd, bd, o := m.fd, m.bd, m.off
	fxy, fx := -1, 0
	for d := fmax; d >= fmin; d -= 2 {
		x := min(fd[o+d], xlim)
		y := x - d
		if y > ylim {
			x, y = ylim+d, ylim
		}
		if x+y > fxy {
			fxy, fx = x+y, x
		}
	}
	bxy, bx := math.MaxInt, 0
	for d := bmax; d >= bmin; d -= 2 {
		x := max(xoff, bd[o+d])
		y := x - d
		if y < yoff {
			x, y = yoff+d, yoff
		}
		if x+y < bxy {
			bxy, bx = x+y, x
		}
	}
	if (xlim+ylim)-bxy < fxy-(xoff+yoff) {
		return fx, fxy - fx
	}
	return bx, bxy - bx
}

// lineOrigins returns, for each line of newLines, the index of the old line
// it was kept from (from the LCS of diffLines), or -1 if the line is new.
// Used for line blame.
func lineOrigins(oldLines, newLines [][]byte) []int {
	out := make([]int, len(newLines))
	i, j := 0, 0
	for _, h := range diffLines(oldLines, newLines) {
		for ; j < h.B0; i, j = i+1, j+1 {
			out[j] = i
		}
		for ; j < h.B1; j++ {
			out[j] = -1
		}
		i = h.A1
	}
	for ; j < len(newLines); i, j = i+1, j+1 {
		out[j] = i
	}
	return out
}
