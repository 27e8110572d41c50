package layerstack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// BlameRange says that Count lines from Start (1-based) belong to Owner.
// The ranges of a file tile it exactly: in order, without gaps or overlap.
type BlameRange struct {
	Start int    `json:"start_line"`
	Count int    `json:"line_count"`
	Owner string `json:"owner"`
}

// Blame owners other than sessions and operations.
const (
	OwnerOriginal = "original" // base content never touched since
	OwnerUnknown  = "unknown"  // no record (e.g. a layer from before blame)
)

// NoAuditError says no published layer ever wrote p: a file of the
// workspace base never touched since, a directory, or a path nothing wrote.
// (The seed keys its audit records by path; these have none.)
type NoAuditError struct{ Path string }

func (e *NoAuditError) Error() string { return "no auditability record for path: " + e.Path }

// Blame returns the line owners of the head's version of p. Owners survive
// merges: a line keeps the owner of the layer that wrote it. As the seed's
// audit records: a file written on the gitignored route is attributed
// wholesale (one range, line 1, count 1, whatever its length); a deleted
// file keeps the ranges of the last layer that wrote it; a path no layer
// wrote is a *NoAuditError.
func (s *Store) Blame(p string) ([]BlameRange, error) {
	p, err := CleanPath(p)
	if err != nil {
		return nil, err
	}
	var out []BlameRange
	err = s.Head().with(func(st stack) error {
		m := s.head.Load()
		e, err := lookup(st, p)
		if errors.Is(err, fs.ErrNotExist) {
			out, err = s.lastRecord(m, p)
			return err
		}
		if err != nil {
			return err
		}
		if e.Kind != KindFile {
			return &NoAuditError{Path: p}
		}
		meta, err := s.meta(m.Layers[e.Layer].ID)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if meta != nil && meta.Kind == LayerBase {
			return &NoAuditError{Path: p}
		}
		if w := meta.wholesale(p); w != nil {
			out = w
			return nil
		}
		n, err := countLines(e.full)
		if err != nil {
			return err
		}
		out, err = s.ownerRanges(m, e, n)
		return err
	})
	return out, err
}

// countLines counts the lines of the file at name as splitLines would
// (a final line without "\n" counts), reading it in chunks: a blame of a
// file of any size holds a chunk, not the file.
func countLines(name string) (int, error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	n, last := 0, byte('\n')
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += bytes.Count(buf[:k], []byte{'\n'})
			last = buf[k-1]
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if last != '\n' {
		n++
	}
	return n, nil
}

// ownerRanges is lineOwners as ranges, for the n lines of the file entry
// e of manifest m, without a value per line.
func (s *Store) ownerRanges(m *Manifest, e Entry, n int) ([]BlameRange, error) {
	if n == 0 {
		return nil, nil
	}
	meta, err := s.meta(m.Layers[e.Layer].ID)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	whole := func(o string) []BlameRange { return []BlameRange{{Start: 1, Count: n, Owner: o}} }
	switch {
	case meta == nil:
		return whole(OwnerUnknown), nil
	case meta.Kind == LayerBase:
		return whole(OwnerOriginal), nil
	}
	ranges, ok := meta.Blame[e.Path]
	if !ok || rangesLen(ranges) != n {
		return whole(OwnerUnknown), nil
	}
	var out []BlameRange
	for _, r := range ranges {
		if k := len(out); k > 0 && out[k-1].Owner == r.Owner {
			out[k-1].Count += r.Count
			continue
		}
		out = append(out, BlameRange{Start: r.Start, Count: r.Count, Owner: r.Owner})
	}
	return out, nil
}

// lastRecord is the blame of a path the head does not have: the ranges of
// the newest layer that wrote it (a delete records nothing).
func (s *Store) lastRecord(m *Manifest, p string) ([]BlameRange, error) {
	for _, l := range m.Layers { // newest first
		meta, err := s.meta(l.ID)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if w := meta.wholesale(p); w != nil {
			return w, nil
		}
		if r, ok := meta.Blame[p]; ok {
			return append([]BlameRange(nil), r...), nil
		}
	}
	return nil, &NoAuditError{Path: p}
}

// wholesale is the seed's one-range blame of a file this layer wrote on the
// gitignored route, or nil.
func (m *LayerMeta) wholesale(p string) []BlameRange {
	if m == nil {
		return nil
	}
	for _, po := range m.Paths {
		if po.Path == p && po.Outcome == OutcomeIgnored && po.Change == string(ChangeWrite) {
			return []BlameRange{{Start: 1, Count: 1, Owner: m.Owner}}
		}
	}
	return nil
}

// lineOwners returns one owner per line of the file entry e of manifest m.
func (s *Store) lineOwners(m *Manifest, e Entry, n int) ([]string, error) {
	owners := make([]string, n)
	layer := m.Layers[e.Layer]
	meta, err := s.meta(layer.ID)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	fill := func(o string) []string {
		for i := range owners {
			owners[i] = o
		}
		return owners
	}
	if meta == nil {
		return fill(OwnerUnknown), nil
	}
	if meta.Kind == LayerBase {
		return fill(OwnerOriginal), nil
	}
	ranges, ok := meta.Blame[e.Path]
	if !ok || rangesLen(ranges) != n {
		return fill(OwnerUnknown), nil
	}
	i := 0
	for _, r := range ranges {
		for k := 0; k < r.Count; k++ {
			owners[i] = r.Owner
			i++
		}
	}
	return owners, nil
}

// blameWrite computes the line owners of a write about to be committed on
// head: lines kept from the head's version keep their owners, the rest
// belong to owner. Binary files get one owner for the whole file.
func (s *Store) blameWrite(head *Manifest, headDirs stack, pl planned, owner string) ([]BlameRange, error) {
	if owner == "" {
		owner = OwnerUnknown
	}
	if pl.ch.Size > MergeMaxBytes {
		return nil, nil
	}
	content, err := readChange(pl.ch, MergeMaxBytes)
	if err != nil {
		return nil, err
	}
	lines := splitLines(content)
	owners := make([]string, len(lines))
	for i := range owners {
		owners[i] = owner
	}
	if !IsText(content) {
		return compressOwners(owners), nil
	}
	e, err := lookup(headDirs, pl.ch.Path)
	if err == nil && e.Kind == KindFile && e.Size <= MergeMaxBytes {
		prev, err := readFull(e.full)
		if err != nil {
			return nil, err
		}
		if IsText(prev) {
			prevLines := splitLines(prev)
			prevOwners, err := s.lineOwners(head, e, len(prevLines))
			if err != nil {
				return nil, err
			}
			for i, o := range lineOrigins(prevLines, lines) {
				if o >= 0 {
					owners[i] = prevOwners[o]
				}
			}
		}
	}
	return compressOwners(owners), nil
}

func compressOwners(owners []string) []BlameRange {
	var out []BlameRange
	for i, o := range owners {
		if n := len(out); n > 0 && out[n-1].Owner == o {
			out[n-1].Count++
			continue
		}
		out = append(out, BlameRange{Start: i + 1, Count: 1, Owner: o})
	}
	return out
}

func rangesLen(rs []BlameRange) int {
	n := 0
	for _, r := range rs {
		n += r.Count
	}
	return n
}

// CheckTiling verifies the tiling invariant of blame ranges over n lines.
func CheckTiling(rs []BlameRange, n int) error {
	next := 1
	for _, r := range rs {
		if r.Start != next || r.Count < 1 || strings.TrimSpace(r.Owner) == "" {
			return fmt.Errorf("blame range %+v breaks the tiling at line %d", r, next)
		}
		next += r.Count
	}
	if next != n+1 {
		return fmt.Errorf("blame ranges cover %d lines, the file has %d", next-1, n)
	}
	return nil
}
