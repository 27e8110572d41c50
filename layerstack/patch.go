package layerstack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Git-style diffs: the headers git writes (new/deleted file mode, old/new
// mode, symlinks as mode 120000) around UnifiedDiff hunks, so the output
// applies with `git apply` and reads like `git diff`.

type diffSide struct {
	exists  bool
	symlink bool
	mode    fs.FileMode
	content []byte
}

func gitMode(d diffSide) string {
	if d.symlink {
		return "120000"
	}
	if d.mode&0o111 != 0 {
		return "100755"
	}
	return "100644"
}

func sideOf(e Entry, err error) (diffSide, error) {
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrSymlinkInPath) {
			return diffSide{}, nil
		}
		return diffSide{}, err
	}
	switch e.Kind {
	case KindFile:
		b, err := readFull(e.full)
		return diffSide{exists: true, mode: e.Mode, content: b}, err
	case KindSymlink:
		return diffSide{exists: true, symlink: true, content: []byte(e.Target)}, nil
	}
	return diffSide{}, nil
}

// writeGitDiff writes one path's diff; it writes nothing when the sides are equal.
func writeGitDiff(w io.Writer, p string, a, b diffSide) error {
	sameContent := string(a.content) == string(b.content)
	if a.exists == b.exists && sameContent && gitMode(a) == gitMode(b) {
		return nil
	}
	if a.exists && b.exists && a.symlink != b.symlink {
		// A type change is a deletion plus a creation, as git writes it.
		if err := writeGitDiff(w, p, a, diffSide{}); err != nil {
			return err
		}
		return writeGitDiff(w, p, diffSide{}, b)
	}
	fmt.Fprintf(w, "diff --git a/%s b/%s\n", p, p)
	from, to := "a/"+p, "b/"+p
	switch {
	case !a.exists:
		fmt.Fprintf(w, "new file mode %s\n", gitMode(b))
		from = "/dev/null"
	case !b.exists:
		fmt.Fprintf(w, "deleted file mode %s\n", gitMode(a))
		to = "/dev/null"
	case gitMode(a) != gitMode(b):
		fmt.Fprintf(w, "old mode %s\nnew mode %s\n", gitMode(a), gitMode(b))
	}
	if sameContent {
		return nil
	}
	if !IsText(a.content) || !IsText(b.content) {
		_, err := fmt.Fprintf(w, "Binary files %s and %s differ\n", from, to)
		return err
	}
	fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to)
	return UnifiedDiff(w, a.content, b.content, 3)
}

// DiffSummary lists the paths a diff covers.
type DiffSummary struct {
	Paths []DiffPath `json:"paths"`
}

// DiffPath is one changed path in a diff.
type DiffPath struct {
	Path   string `json:"path"`
	Status string `json:"status"` // added, modified, deleted, mode_changed
}

// Diff writes the unified diff of a change set against its lease's base
// (what diff_workspace_session shows), and summarises it.
func (s *Store) Diff(ctx context.Context, leaseID string, cs *ChangeSet, w io.Writer) (*DiffSummary, error) {
	v, err := s.View(leaseID)
	if err != nil {
		return nil, err
	}
	sum := &DiffSummary{Paths: []DiffPath{}}
	err = v.with(func(base stack) error {
		for _, ch := range cs.normalize() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := diffChange(w, base, ch, sum); err != nil {
				return fmt.Errorf("diff %s: %w", ch.Path, err)
			}
		}
		return nil
	})
	return sum, err
}

func diffChange(w io.Writer, base stack, ch Change, sum *DiffSummary) error {
	p, err := CleanPath(ch.Path)
	if err != nil {
		return err
	}
	be, berr := lookup(base, p)
	switch ch.Kind {
	case ChangeDir:
		return nil
	case ChangeDelete, ChangeOpaque:
		if berr != nil || be.Kind != KindDirectory {
			if ch.Kind == ChangeOpaque {
				return nil
			}
			a, err := sideOf(be, berr)
			if err != nil || !a.exists {
				return err
			}
			sum.Paths = append(sum.Paths, DiffPath{Path: p, Status: "deleted"})
			return writeGitDiff(w, p, a, diffSide{})
		}
		// A deleted (or replaced) directory: every file below it goes, except
		// what an opaque replacement writes again (those diff on their own).
		return walkMerged(base, be, func(e Entry) error {
			if e.Kind == KindDirectory {
				return nil
			}
			a, err := sideOf(e, nil)
			if err != nil {
				return err
			}
			sum.Paths = append(sum.Paths, DiffPath{Path: e.Path, Status: "deleted"})
			return writeGitDiff(w, e.Path, a, diffSide{})
		})
	}
	a, err := sideOf(be, berr)
	if err != nil {
		return err
	}
	b := diffSide{exists: true, mode: ch.Mode, symlink: ch.Kind == ChangeSymlink, content: []byte(ch.Target)}
	if ch.Kind == ChangeWrite {
		if b.content, err = diffContent(ch); err != nil {
			return err
		}
		if len(a.content) > MergeMaxBytes {
			a.content = largeContent(sha256.Sum256(a.content))
		}
	}
	status := "modified"
	switch {
	case !a.exists:
		status = "added"
	case string(a.content) == string(b.content) && gitMode(a) != gitMode(b):
		status = "mode_changed"
	case string(a.content) == string(b.content) && a.symlink == b.symlink:
		return nil
	}
	sum.Paths = append(sum.Paths, DiffPath{Path: p, Status: status})
	return writeGitDiff(w, p, a, b)
}

// patchSink writes an export as a git patch: each folded entry is diffed
// between the base and the head.
type patchSink struct {
	w          io.Writer
	base, head stack
	res        *ExportResult
	err        error
}

func (ps *patchSink) pair(p string) error {
	a, err := sideOf(lookup(ps.base, p))
	if err != nil {
		return err
	}
	b, err := sideOf(lookup(ps.head, p))
	if err != nil {
		return err
	}
	return writeGitDiff(ps.w, p, a, b)
}

func (ps *patchSink) dir(p string, _ fs.FileInfo, opaque bool) error {
	ps.res.Entries.Dirs++
	if !opaque {
		return nil
	}
	ps.res.Entries.Opaques++
	return ps.deletedBelow(p)
}

// deletedBelow diffs base files under p that the head no longer has.
func (ps *patchSink) deletedBelow(p string) error {
	be, err := lookup(ps.base, p)
	if err != nil || be.Kind != KindDirectory {
		return nil
	}
	return walkMerged(ps.base, be, func(e Entry) error {
		if e.Kind == KindDirectory {
			return nil
		}
		if _, err := lookup(ps.head, e.Path); err == nil {
			return nil // still there: the fold visits it
		}
		a, err := sideOf(e, nil)
		if err != nil {
			return err
		}
		return writeGitDiff(ps.w, e.Path, a, diffSide{})
	})
}

func (ps *patchSink) file(p, _ string, _ fs.FileInfo) error {
	ps.res.Entries.Files++
	return ps.pair(p)
}

func (ps *patchSink) symlink(p, _ string, _ fs.FileInfo) error {
	ps.res.Entries.Symlinks++
	return ps.pair(p)
}

func (ps *patchSink) whiteout(p string) error {
	ps.res.Entries.Whiteouts++
	be, err := lookup(ps.base, p)
	if err == nil && be.Kind == KindDirectory {
		return ps.deletedBelow(p)
	}
	return ps.pair(p)
}

// diffContent is a write's bytes for a diff. A file over MergeMaxBytes is
// never held in memory: it stands for itself by a digest marker, which
// compares equal to an identical large file and diffs as binary.
func diffContent(ch Change) ([]byte, error) {
	if ch.Data != nil || ch.Source == "" {
		if len(ch.Data) > MergeMaxBytes {
			return largeContent(sha256.Sum256(ch.Data)), nil
		}
		return ch.Data, nil
	}
	b, err := readChange(ch, MergeMaxBytes)
	var tl *TooLargeError
	if !errors.As(err, &tl) {
		return b, err
	}
	f, _, err := ch.OpenSource()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, &os.PathError{Op: "read", Path: ch.Path, Err: unwrapPathErr(err)}
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return largeContent(sum), nil
}

// largeContent marks a large file by its digest (a NUL makes it binary).
func largeContent(sum [sha256.Size]byte) []byte {
	return append([]byte("\x00large file sha256:"), hex.EncodeToString(sum[:])...)
}
