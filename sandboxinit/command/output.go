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

func (s *lineStore) add(b []byte, st stream) {
	s.compact()
	s.text = append(s.text, b...)
	end := s.base + int64(len(s.text))
	s.ends = append(s.ends, uint64(end)<<1|uint64(st))
	s.runes += int64(utf8.RuneCount(b))
	for s.used() > s.max && len(s.ends)-s.head > 1 {
		s.first = int64(s.ends[s.head] >> 1)
		s.head++
		s.dropped++
	}
}

// dropAll drops every retained line; offsets and counts stay.
func (s *lineStore) dropAll() {
	s.dropped = s.total()
	s.base += int64(len(s.text))
	s.first = s.base
	s.text, s.ends, s.head = nil, nil, 0
}

// compact moves the retained part to the front of the arrays once the
// dropped part is at least as large, so dropping is amortized O(1) and the
// arrays never grow past twice the budget.
func (s *lineStore) compact() {
	if off := s.first - s.base; off > 0 && off >= int64(len(s.text))/2 {
		n := copy(s.text, s.text[off:])
		s.text = s.text[:n]
		s.base = s.first
	}
	if s.head > 0 && s.head >= len(s.ends)/2 {
		n := copy(s.ends, s.ends[s.head:])
		s.ends = s.ends[:n]
		s.head = 0
	}
}

// shrink releases the arrays' spare capacity (the command ended: nothing is
// added any more).
func (s *lineStore) shrink() {
	if off := s.first - s.base; off > 0 || len(s.text) < cap(s.text)*3/4 {
		s.text = append([]byte(nil), s.text[off:]...)
		s.base = s.first
	}
	if s.head > 0 || len(s.ends) < cap(s.ends)*3/4 {
		s.ends = append([]uint64(nil), s.ends[s.head:]...)
		s.head = 0
	}
}

// output splits a command's byte streams into lines.
type output struct {
	lines   lineStore
	partial [2][]byte // per stream, the bytes after its last newline
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
