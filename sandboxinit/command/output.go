package command

import (
	"bytes"
	"unicode/utf8"
)

// maxLineBytes caps one line; a longer one is split into several lines.
const maxLineBytes = 64 << 10

// lineCost is what one line costs in the MaxBytes budget besides its text
// (its entry in lineStore.ends).
const lineCost = 8

// stream is where a line came from.
type stream uint8

const (
	streamStdout stream = 0
	streamStderr stream = 1
)

func (s stream) String() string {
	if s == streamStderr {
		return "stderr"
	}
	return "stdout"
}

// lineStore keeps a command's final lines in one byte arena plus one packed
// word per line, so 500k short lines cost a few MiB and no per-line
// allocation. When the budget is exceeded the oldest lines are dropped;
// offsets keep counting.
type lineStore struct {
	max     int64
	text    []byte   // texts back to back; text[0] is at absolute position base
	base    int64    // absolute position of text[0]
	first   int64    // absolute position where the first retained line starts
	ends    []uint64 // (absolute end << 1) | stream, for lines from head on
	head    int      // index in ends of the first retained line
	dropped int      // lines dropped so far = offset of the first retained line
	runes   int64    // runes of every line ever stored, dropped ones too
}

func (s *lineStore) total() int       { return s.dropped + len(s.ends) - s.head }
func (s *lineStore) firstOffset() int { return s.dropped }

// span returns the absolute [start, end) of the line at offset off, which
// must be retained.
func (s *lineStore) span(off int) (start, end int64, st stream) {
	i := s.head + off - s.dropped
	start = s.first
	if i > s.head {
		start = int64(s.ends[i-1] >> 1)
	}
	return start, int64(s.ends[i] >> 1), stream(s.ends[i] & 1)
}

func (s *lineStore) line(off int) ([]byte, stream) {
	start, end, st := s.span(off)
	return s.text[start-s.base : end-s.base], st
}

func (s *lineStore) lineLen(off int) int {
	start, end, _ := s.span(off)
	return int(end - start)
}

func (s *lineStore) used() int64 {
	end := s.base + int64(len(s.text))
	return end - s.first + lineCost*int64(len(s.ends)-s.head)
}

// held is the memory the store holds: its arrays' capacity, which the
// engine's output budget counts.
func (s *lineStore) held() int64 {
	return int64(cap(s.text)) + lineCost*int64(cap(s.ends))
}

func (s *lineStore) add(b []byte, st stream) {
	if len(s.text)+len(b) > cap(s.text) || len(s.ends) == cap(s.ends) {
		s.resize(len(b), 1, false)
	}
	s.text = append(s.text, b...)
	end := s.base + int64(len(s.text))
	s.ends = append(s.ends, uint64(end)<<1|uint64(st))
	s.runes += int64(utf8.RuneCount(b))
	s.drop()
}

// drop drops the oldest lines while the store keeps more than max, but
// never the newest line.
func (s *lineStore) drop() {
	for s.used() > s.max && len(s.ends)-s.head > 1 {
		s.first = int64(s.ends[s.head] >> 1)
		s.head++
		s.dropped++
	}
}

// limit lowers (or raises) max, drops the oldest lines beyond it and
// releases the room they held.
func (s *lineStore) limit(max int64) {
	s.max = max
	s.drop()
	s.resize(0, 0, true)
}

// dropAll drops every retained line; offsets and counts stay.
func (s *lineStore) dropAll() {
	s.dropped = s.total()
	s.base += int64(len(s.text))
	s.first = s.base
	s.text, s.ends, s.head = nil, nil, 0
}

// resize makes room for n more bytes and lines more lines. An array that
// lacks room (or every array, when tight) gets its retained part moved to
// its front, in place when that frees an eighth of it, else into a new
// array with a quarter more room; the other array is left alone unless it
// holds more than half again what it keeps. So dropping is amortized O(1)
// (an array moves only when what was dropped since is a good part of it)
// and a store holds about 1.25 × what it keeps, at most 1.5 × (plus the
// newest line). It used to grow to twice that before it compacted, with
// append's growth on top, and kept the room after dropping.
func (s *lineStore) resize(n, lines int, tight bool) {
	var off int
	s.text, off = fit(s.text, int(s.first-s.base), n, tight)
	s.base = s.first - int64(off)
	s.ends, s.head = fit(s.ends, s.head, lines, tight)
}

// fit returns a with room for n more elements after it, per resize's rule,
// and where a[from] is in it now.
func fit[T any](a []T, from, n int, tight bool) ([]T, int) {
	live := len(a) - from
	need := live + n
	if need == 0 {
		return nil, 0
	}
	c := cap(a)
	if short := len(a)+n > c; !short {
		bound := spare(need)
		if !tight {
			bound += need / 4
		}
		if c <= bound {
			return a, from
		}
	} else if c >= need && c <= spare(need) && c-need >= need/8 {
		return a[:copy(a, a[from:])], 0
	}
	b := make([]T, live, spare(need))
	copy(b, a[from:])
	return b, 0
}

// spare is the capacity for n elements: a quarter more, and a few more so
// that a small store does not move on every line.
func spare(n int) int { return n + n/4 + 16 }

// shrink releases the arrays' spare capacity (the command ended: nothing is
// added any more).
func (s *lineStore) shrink() {
	if off := s.first - s.base; off > 0 || len(s.text) < cap(s.text) {
		s.text = append([]byte(nil), s.text[off:]...)
		s.base = s.first
	}
	if s.head > 0 || len(s.ends) < cap(s.ends) {
		s.ends = append([]uint64(nil), s.ends[s.head:]...)
		s.head = 0
	}
}

// output splits a command's byte streams into lines.
type output struct {
	lines   lineStore
	partial [2][]byte // per stream, the bytes after its last newline
}

// maxIdleTail is the most room a stream's tail keeps once its line is
// complete: the room a long line needed is released.
const maxIdleTail = 4 << 10

// held is the memory the output holds: the lines' arrays and the tails.
func (o *output) held() int64 {
	return o.lines.held() + int64(cap(o.partial[0])+cap(o.partial[1]))
}

// write appends bytes read from stream st. Lines end at "\n" (a "\r" before
// it is dropped); a line longer than maxLineBytes is split at a rune boundary.
func (o *output) write(st stream, p []byte) {
	tail := &o.partial[st]
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			*tail = append(*tail, p...)
			for len(*tail) > maxLineBytes {
				n := cutAt(*tail, maxLineBytes)
				o.lines.add((*tail)[:n], st)
				*tail = (*tail)[:copy(*tail, (*tail)[n:])]
			}
			return
		}
		line := p[:i]
		p = p[i+1:]
		if len(*tail) > 0 {
			*tail = append(*tail, line...)
			line = *tail
		}
		o.addLine(bytes.TrimSuffix(line, []byte{'\r'}), st)
		*tail = (*tail)[:0]
		if cap(*tail) > maxIdleTail {
			*tail = nil
		}
	}
}

func (o *output) addLine(line []byte, st stream) {
	for len(line) > maxLineBytes {
		n := cutAt(line, maxLineBytes)
		o.lines.add(line[:n], st)
		line = line[n:]
	}
	o.lines.add(line, st)
}

// flush makes the unterminated tails final lines (the command ended).
func (o *output) flush() {
	for st := range o.partial {
		if t := o.partial[st]; len(t) > 0 {
			o.addLine(bytes.TrimSuffix(t, []byte{'\r'}), stream(st))
		}
		o.partial[st] = nil
	}
}

// partialText is stream st's unterminated tail as shown while running.
func (o *output) partialText(st stream) []byte {
	return bytes.TrimSuffix(o.partial[st], []byte{'\r'})
}

// cutAt returns where to split b so the first part has at most limit bytes
// and does not end inside a UTF-8 sequence (unless b is not UTF-8 there).
func cutAt(b []byte, limit int) int {
	for n := limit; n > limit-utf8.UTFMax && n > 0; n-- {
		if utf8.RuneStart(b[n]) {
			return n
		}
	}
	return limit
}
