package layerstack

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// syncfsThreshold: above this many entries one syncfs beats per-file fsyncs.
const syncfsThreshold = 16

// builder writes resolved changes into a directory in overlay format: a new
// layer in staging, or a session's rewritten upper dir.
type builder struct {
	dir     string
	head    stack // parent directories take the head's modes
	created map[string]bool
	synced  []string
	recs    []digestRec
	counts  Counts
	bytes   int64
}

type digestRec struct{ path, kind, mode, data string }

func newBuilder(dir string, head stack) (*builder, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	return &builder{dir: dir, head: head, created: map[string]bool{"": true}}, nil
}

func (b *builder) mkdirParents(p string) error {
	for _, a := range ancestors(p) {
		if b.created[a] {
			continue
		}
		mode := fs.FileMode(0o755)
		if e, err := lookup(b.head, a); err == nil && e.Kind == KindDirectory {
			mode = e.Mode
		}
		if err := b.mkdir(a, mode, false); err != nil {
			return err
		}
	}
	return nil
}

func (b *builder) mkdir(p string, mode fs.FileMode, opaque bool) error {
	full := fullPath(b.dir, p)
	if !b.created[p] {
		if err := os.Mkdir(full, 0o700); err != nil {
			return err
		}
	}
	if err := os.Chmod(full, mode.Perm()); err != nil {
		return err
	}
	kind := "dir"
	if opaque {
		kind = "opaque"
		if err := markOpaque(full); err != nil {
			return err
		}
		b.counts.Opaques++
	} else {
		b.counts.Dirs++
	}
	if b.created[p] {
		b.replaceRec(p, kind, fmt.Sprintf("%04o", mode.Perm()))
	} else {
		b.recs = append(b.recs, digestRec{p, kind, fmt.Sprintf("%04o", mode.Perm()), ""})
	}
	b.created[p] = true
	b.synced = append(b.synced, full)
	return nil
}

func (b *builder) replaceRec(p, kind, mode string) {
	for i := range b.recs {
		if b.recs[i].path == p {
			b.recs[i].kind, b.recs[i].mode = kind, mode
		}
	}
}

// add writes one planned change. A write whose content sits in a frozen
// staged file is hardlinked (or, with move, renamed) into place on the same
// filesystem, so it is never copied twice and can no longer change under us.
// A publish links: a retry after the head moved needs the staged file again.
func (b *builder) add(pl planned, move bool) error {
	ch := pl.ch
	if err := b.mkdirParents(ch.Path); err != nil {
		return err
	}
	full := fullPath(b.dir, ch.Path)
	switch ch.Kind {
	case ChangeWrite:
		if err := b.writeFile(full, ch, move); err != nil {
			return err
		}
		b.recs = append(b.recs, digestRec{ch.Path, "file", fmt.Sprintf("%04o", ch.Mode.Perm()), pl.hash})
		b.counts.Files++
		b.bytes += ch.Size
	case ChangeDelete:
		if err := writeWhiteout(full); err != nil {
			return err
		}
		b.recs = append(b.recs, digestRec{ch.Path, "whiteout", "", ""})
		b.counts.Deletes++
		b.synced = append(b.synced, filepath.Dir(full))
	case ChangeSymlink:
		if err := os.Symlink(ch.Target, full); err != nil {
			return err
		}
		b.recs = append(b.recs, digestRec{ch.Path, "symlink", "", ch.Target})
		b.counts.Symlinks++
		b.synced = append(b.synced, filepath.Dir(full))
	case ChangeDir:
		return b.mkdir(ch.Path, ch.Mode, false)
	case ChangeOpaque:
		return b.mkdir(ch.Path, ch.Mode, true)
	default:
		return fmt.Errorf("unknown change kind %q", ch.Kind)
	}
	return nil
}

func (b *builder) writeFile(full string, ch Change, move bool) error {
	if ch.Data == nil && ch.Source != "" {
		if move {
			if err := os.Rename(ch.Source, full); err != nil {
				return err
			}
		} else if err := linkOrCopy(ch.Source, full); err != nil {
			return err
		}
	} else if err := os.WriteFile(full, ch.Data, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(full, ch.Mode.Perm()); err != nil {
		return err
	}
	b.synced = append(b.synced, full)
	return nil
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	_, _, err := copyFile(src, dst)
	return err
}

// copyFile copies src to dst (created, 0600) and returns the sha256 of what
// it wrote, which is the content from then on, whatever src does next.
func copyFile(src, dst string) (string, int64, error) {
	in, _, err := openOwnRegular(src)
	if err != nil {
		return "", 0, err
	}
	defer in.Close()
	return copyOpen(in, dst)
}

// copyOpen streams in (from where it is) into dst (created, 0600) and
// returns the sha256 of what it wrote.
func copyOpen(in *os.File, dst string) (string, int64, error) {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	hw := newHoleWriter(int(out.Fd()))
	n, err := io.Copy(io.MultiWriter(hw, h), in)
	if err == nil {
		err = hw.Close()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// sync makes the built tree durable: one syncfs for large trees, else an
// fsync per written entry (cheaper than flushing the whole volume, which
// also carries every session's upper dir).
func (b *builder) sync() error {
	if len(b.synced) > syncfsThreshold {
		fd, err := unix.Open(b.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Syncfs(fd)
	}
	seen := map[string]bool{}
	for _, p := range append(b.synced, b.dir) {
		if seen[p] {
			continue
		}
		seen[p] = true
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// syncPaths lists what sync would fsync: every written entry, then the
// built directory itself (a commit flushes them in its syncBatch).
func (b *builder) syncPaths() []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range append(b.synced, b.dir) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

func (b *builder) digest() string { return digestOf(b.recs) }

func digestOf(recs []digestRec) string {
	sort.Slice(recs, func(i, j int) bool { return recs[i].path < recs[j].path })
	h := sha256.New()
	for _, r := range recs {
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\n", r.path, r.kind, r.mode, r.data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// treeDigest recomputes, from the directory alone, the digest the builder
// (or an import) recorded: the verification pass compares the two.
func treeDigest(dir string) (string, Counts, int64, error) {
	var recs []digestRec
	var c Counts
	var bytes int64
	err := filepath.WalkDir(dir, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if full == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, full)
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		le, err := classify(full, fi)
		if err != nil {
			return err
		}
		mode := fmt.Sprintf("%04o", fi.Mode().Perm())
		switch le.kind {
		case kindFile:
			h, err := hashFile(full)
			if err != nil {
				return err
			}
			recs = append(recs, digestRec{rel, "file", mode, h})
			c.Files++
			bytes += fi.Size()
		case kindDir:
			k := "dir"
			if le.opaque {
				k = "opaque"
				c.Opaques++
			} else {
				c.Dirs++
			}
			recs = append(recs, digestRec{rel, k, mode, ""})
		case kindSymlink:
			t, err := os.Readlink(full)
			if err != nil {
				return err
			}
			recs = append(recs, digestRec{rel, "symlink", "", t})
			c.Symlinks++
		case kindWhiteout:
			recs = append(recs, digestRec{rel, "whiteout", "", ""})
			c.Deletes++
		default:
			return fmt.Errorf("special file %s in layer", rel)
		}
		return nil
	})
	return digestOf(recs), c, bytes, err
}

func readFull(name string) ([]byte, error) { return os.ReadFile(name) }

// readChange returns a write's bytes, at most max of them (a larger
// source is a *TooLargeError): its source is opened as Change.OpenSource
// says, never by a path a session can swap.
func readChange(ch Change, max int64) ([]byte, error) {
	if ch.Data != nil || ch.Source == "" {
		return ch.Data, nil
	}
	f, fi, err := ch.OpenSource()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > max {
		return nil, &TooLargeError{Path: ch.Path, Size: fi.Size(), Max: max}
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, &os.PathError{Op: "read", Path: ch.Path, Err: unwrapPathErr(err)}
	}
	if int64(len(b)) > max {
		return nil, &TooLargeError{Path: ch.Path, Size: int64(len(b)), Max: max}
	}
	return b, nil
}

// setMtime keeps the source's modification time on a clean write, so build
// tools see unchanged timestamps for unchanged inputs.
func setMtime(full string, t time.Time) {
	if !t.IsZero() {
		_ = os.Chtimes(full, t, t)
	}
}

var errStale = errors.New("head moved")
