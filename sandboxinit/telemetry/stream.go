package telemetry

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// Limits of the seed's observability store (seed-spec §6).
const (
	DefaultEventBudget  = 4 << 20 // events and spans, both segments
	DefaultSampleBudget = 1 << 20 // resource samples, both segments
	MaxLineBytes        = 16 << 10
	MinBudget           = 2 * MaxLineBytes
)

// Stream is one bounded NDJSON log kept in two segments, <name>.ndjson (the
// current one, appended to) and <name>.ndjson.1 (the previous one). Each
// segment holds at most half the budget: an append that would take the
// current segment past it first renames the current segment over the
// previous one. So the stream never holds more than its budget and always
// keeps at least the newest half of it.
//
// Appends are fail-open: an error is counted (Stats.Dropped) and the caller
// never sees it, because losing a record must never fail the operation it
// describes.
type Stream struct {
	dir, name string
	segMax    int64
	maxLine   int

	mu     sync.Mutex
	f      *os.File // current segment, opened on the first append
	size   int64    // bytes in the current segment
	broken bool     // a failed write could not be undone: rotate before the next append

	appended  atomic.Uint64
	dropped   atomic.Uint64
	oversize  atomic.Uint64
	rotations atomic.Uint64
	lastErr   atomic.Pointer[string]
}

// StreamStats describes a stream for the daemon view and /health.
type StreamStats struct {
	Name        string `json:"name"`
	Path        string `json:"path"`
	BudgetBytes int64  `json:"budget_bytes"`
	Bytes       int64  `json:"bytes"`
	Appended    uint64 `json:"appended"`
	Dropped     uint64 `json:"dropped"`
	Oversize    uint64 `json:"dropped_oversize"`
	Rotations   uint64 `json:"rotations"`
	LastError   string `json:"last_error,omitempty"`
}

// OpenStream opens (without writing anything) the stream name in dir with a
// budget for both segments together. The budget is raised to MinBudget and
// rounded down to an even number.
func OpenStream(dir, name string, budget int64) (*Stream, error) {
	if budget < MinBudget {
		budget = MinBudget
	}
	s := &Stream{dir: dir, name: name, segMax: budget / 2, maxLine: MaxLineBytes}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("observability dir: %w", err)
	}
	fi, err := os.Stat(s.current())
	switch {
	case err == nil:
		s.size = fi.Size()
		s.broken = s.size > 0 && !endsWithNewline(s.current(), s.size)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("stat %s: %w", s.current(), err)
	}
	return s, nil
}

func (s *Stream) current() string  { return filepath.Join(s.dir, s.name+".ndjson") }
func (s *Stream) previous() string { return filepath.Join(s.dir, s.name+".ndjson.1") }

// Paths returns the segment files, previous first.
func (s *Stream) Paths() []string { return []string{s.previous(), s.current()} }

// Append writes one record line (without its newline). Lines longer than
// the line cap are dropped; callers encode records with Encode, which
// truncates attributes to fit.
func (s *Stream) Append(line []byte) {
	if s == nil {
		return
	}
	if len(line)+1 > s.maxLine {
		s.oversize.Add(1)
		s.dropped.Add(1)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.appendLocked(line); err != nil {
		s.dropped.Add(1)
		msg := err.Error()
		s.lastErr.Store(&msg)
		return
	}
	s.appended.Add(1)
}

// drop counts a record that could not even be encoded.
func (s *Stream) drop(err error) {
	if s == nil {
		return
	}
	s.dropped.Add(1)
	msg := err.Error()
	s.lastErr.Store(&msg)
}

func (s *Stream) appendLocked(line []byte) error {
	n := int64(len(line) + 1)
	if s.broken || (s.size > 0 && s.size+n > s.segMax) {
		if err := s.rotateLocked(); err != nil {
			return err
		}
	}
	if s.f == nil {
		f, err := os.OpenFile(s.current(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("open %s: %w", s.current(), err)
		}
		s.f = f
	}
	buf := make([]byte, 0, n)
	buf = append(append(buf, line...), '\n')
	if _, err := s.f.Write(buf); err != nil {
		// A partial line would corrupt the next record: cut it off, or
		// start a new segment if that fails too.
		if terr := s.f.Truncate(s.size); terr != nil {
			s.broken = true
		}
		return fmt.Errorf("append %s: %w", s.current(), err)
	}
	s.size += n
	return nil
}

// rotateLocked renames the current segment over the previous one.
func (s *Stream) rotateLocked() error {
	if s.f != nil {
		_ = s.f.Close()
		s.f = nil
	}
	if err := os.Rename(s.current(), s.previous()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rotate %s: %w", s.current(), err)
	}
	s.size, s.broken = 0, false
	s.rotations.Add(1)
	return nil
}

// Stats returns the stream's counters and its size on disk.
func (s *Stream) Stats() StreamStats {
	st := StreamStats{Name: s.name, Path: s.current(), BudgetBytes: 2 * s.segMax,
		Appended: s.appended.Load(), Dropped: s.dropped.Load(), Oversize: s.oversize.Load(), Rotations: s.rotations.Load()}
	s.mu.Lock()
	st.Bytes = s.size
	s.mu.Unlock()
	if fi, err := os.Stat(s.previous()); err == nil {
		st.Bytes += fi.Size()
	}
	if e := s.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// Close closes the current segment.
func (s *Stream) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// snapshot opens both segments under the lock, so a reader sees a
// consistent pair even if a rotation follows: renames do not affect open
// files. Sizes bound what is read to complete lines at that instant.
func (s *Stream) snapshot() (segs []segment, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range []string{s.current(), s.previous()} { // newest first
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			closeSegments(segs)
			return nil, fmt.Errorf("open %s: %w", p, err)
		}
		size := s.size
		if p == s.previous() {
			fi, err := f.Stat()
			if err != nil {
				f.Close()
				closeSegments(segs)
				return nil, fmt.Errorf("stat %s: %w", p, err)
			}
			size = fi.Size()
		}
		segs = append(segs, segment{f: f, size: size})
	}
	return segs, nil
}

// endsWithNewline reports whether the file's last byte is a newline; a
// crash in the middle of an append leaves a partial line, and the next
// append must not extend it.
func endsWithNewline(name string, size int64) bool {
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [1]byte
	_, err = f.ReadAt(b[:], size-1)
	return err == nil && b[0] == '\n'
}

type segment struct {
	f    *os.File
	size int64
}

func closeSegments(segs []segment) {
	for _, sg := range segs {
		sg.f.Close()
	}
}
