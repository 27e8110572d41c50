package layerstack

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/archive"
)

// StreamImportOptions tune ImportStream.
type StreamImportOptions struct {
	// All imports every file of a git work tree, gitignored ones included
	// (as ImportOptions.All).
	All bool
	// Limits cap the stream (zero fields: archive.DefaultApplyLimits).
	Limits archive.ApplyLimits
}

// ImportStream imports a base layer from a tar stream of a workspace in
// one pass: each entry is checked, written into a fresh directory under
// parent and its file hashed as it is written; the content digest comes
// from those hashes (no second read), and one syncfs before the rename
// makes the layer durable. It yields the base ImportDir yields for the same
// tree: the same id, the same git-aware selection (run on the written tree
// with the container's git), modes, mtimes, symlinks as links.
//
// The stream is a stranger's input. A name with a NUL, an absolute name, a
// ".." component, an over-long name, a path through a symlink or a
// non-directory, a repeated entry, a hard link, a whiteout header or a
// stream past the limits is refused as an *archive.ApplyError and nothing
// is left behind (the directory is removed). Every path is resolved beneath
// the import directory by openat2 without following symlinks, and files are
// created O_EXCL|O_NOFOLLOW, so no entry writes outside it. Names a layer
// cannot hold (the whiteout namespace, invalid UTF-8) and FIFOs or devices
// are skipped and reported, as ImportDir skips them. Setuid, setgid and
// sticky bits and owners are not applied.
func ImportStream(ctx context.Context, r io.Reader, parent string, opts StreamImportOptions) (BaseInfo, *ImportReport, error) {
	tmp, err := importDir(parent)
	if err != nil {
		return BaseInfo{}, nil, err
	}
	defer removeAll(tmp)
	root, err := unix.Open(tmp, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return BaseInfo{}, nil, err
	}
	si := &streamImporter{ctx: ctx, root: root, limits: withImportLimits(opts.Limits), recs: map[string]digestRec{},
		dirs: map[string]int{}, dirMeta: map[string]importDirMeta{}, buf: make([]byte, 256<<10), report: &ImportReport{}}
	t0 := time.Now()
	err = si.run(r)
	si.closeDirs()
	if err == nil {
		if paths, git := gitPaths(tmp, ImportOptions{All: opts.All}); git {
			err = si.keepOnly(tmp, paths)
			si.report.GitAware = true
		}
	}
	if err == nil {
		err = si.finishDirs() // after the pruning, which changes directories' mtimes
	}
	unix.Close(root)
	if err != nil {
		return BaseInfo{}, nil, fmt.Errorf("import stream: %w", err)
	}
	recs := make([]digestRec, 0, len(si.recs))
	var c Counts
	var n int64
	for _, rec := range si.recs {
		recs = append(recs, rec)
		switch rec.kind {
		case "file":
			c.Files++
			n += si.sizes[rec.path]
		case "dir":
			c.Dirs++
		case "symlink":
			c.Symlinks++
		}
	}
	si.report.Files, si.report.Dirs, si.report.Symlinks, si.report.Bytes = c.Files, c.Dirs, c.Symlinks, n
	si.report.WriteMS = max(1, time.Since(t0).Milliseconds())
	return finishImportDigest(tmp, parent, si.report, digestOf(recs), c, n)
}

func withImportLimits(l archive.ApplyLimits) archive.ApplyLimits {
	d := archive.DefaultApplyLimits
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxPathBytes <= 0 {
		l.MaxPathBytes = d.MaxPathBytes
	}
	return l
}

type importDirMeta struct {
	perm  uint32
	mtime time.Time
}

type streamImporter struct {
	ctx     context.Context
	root    int // O_PATH descriptor of the import directory
	limits  archive.ApplyLimits
	entries int
	bytes   int64
	recs    map[string]digestRec // by path: what the digest covers
	sizes   map[string]int64
	dirs    map[string]int           // open O_PATH descriptors of some written directories (at most maxOpenDirs)
	dirMeta map[string]importDirMeta // modes and mtimes, applied at the end
	buf     []byte
	report  *ImportReport
	kind    map[string]string // what the stream made of each path so far ("file", "symlink"; directories are in dirMeta)
	umask   int               // the process's umask (-1: unknown, every file is chmodded)

	// Small files are written by a few writers side by side (creating a
	// file is what an import waits for); recs and sizes of files are
	// theirs to fill, under mu.
	jobs    chan fileJob
	writers sync.WaitGroup
	mu      sync.Mutex
	werr    error
}

// fileJob is one small file for the writers.
type fileJob struct {
	name  string
	data  []byte
	perm  uint32
	mtime time.Time
}

const (
	importWriters   = 4
	importInlineMax = 512 << 10 // larger files are written by the reader, streamed
)

func (si *streamImporter) startWriters() {
	si.jobs = make(chan fileJob, 64)
	for i := 0; i < importWriters; i++ {
		si.writers.Add(1)
		go func() {
			defer si.writers.Done()
			for j := range si.jobs {
				if si.failed() != nil {
					continue
				}
				if err := si.writeSmall(j); err != nil {
					si.fail(err)
				}
			}
		}()
	}
}

// stopWriters waits for the queued files and returns the first error.
func (si *streamImporter) stopWriters() error {
	close(si.jobs)
	si.writers.Wait()
	return si.failed()
}

func (si *streamImporter) fail(err error) {
	si.mu.Lock()
	if si.werr == nil {
		si.werr = err
	}
	si.mu.Unlock()
}

func (si *streamImporter) failed() error {
	si.mu.Lock()
	defer si.mu.Unlock()
	return si.werr
}

// writeSmall creates one file beneath the root (openat2: no symlink
// followed, O_EXCL) with its contents, mode and mtime, and records its hash.
func (si *streamImporter) writeSmall(j fileJob) error {
	// Created with its mode when the umask leaves it whole (0644, 0755:
	// nearly every file), which saves a chmod a file.
	mode, chmod := uint32(0o600), true
	if si.umask >= 0 && j.perm&uint32(si.umask) == 0 {
		mode, chmod = j.perm, false
	}
	fd, err := unix.Openat2(si.root, j.name, &unix.OpenHow{Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Mode: uint64(mode), Resolve: ResolveBeneath})
	if err != nil {
		return si.ioErr(j.name, err)
	}
	werr := writeAll(fd, j.data)
	if werr == nil && chmod {
		werr = unix.Fchmod(fd, j.perm)
	}
	if werr == nil {
		ts := []unix.Timespec{unix.NsecToTimespec(j.mtime.UnixNano()), unix.NsecToTimespec(j.mtime.UnixNano())}
		_ = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
	}
	if cerr := unix.Close(fd); werr == nil && cerr != nil {
		werr = cerr
	}
	if werr != nil {
		return &archive.ApplyError{Path: j.name, Reason: archive.ReasonIO, Phase: archive.PhaseApply, Err: werr}
	}
	sum := sha256.Sum256(j.data)
	si.mu.Lock()
	si.sizes[j.name] = int64(len(j.data))
	si.recs[j.name] = digestRec{j.name, "file", fmt.Sprintf("%04o", j.perm), hex.EncodeToString(sum[:])}
	si.mu.Unlock()
	return nil
}

func refuse(name, reason string, err error) error {
	return &archive.ApplyError{Path: name, Reason: reason, Phase: archive.PhaseValidate, Err: err}
}

func (si *streamImporter) run(r io.Reader) error {
	si.sizes, si.kind, si.umask = map[string]int64{}, map[string]string{}, processUmask()
	si.startWriters()
	err := si.read(r)
	if werr := si.stopWriters(); werr != nil {
		return werr // the cause: the reader stopped on it
	}
	return err
}

func (si *streamImporter) read(r io.Reader) error {
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	for {
		if err := si.ctx.Err(); err != nil {
			return refuse("", archive.ReasonCanceled, err)
		}
		if err := si.failed(); err != nil {
			return err
		}
		// Every entry's data was read whole, so the next header starts at
		// the block boundary after it.
		entryEnd := (cr.n + 511) / 512 * 512
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// A stream cut at an entry boundary must not import as a
			// smaller tree: the end-of-archive marker is required.
			if cr.n-entryEnd != 2*512 {
				return refuse("", archive.ReasonBadStream, fmt.Errorf("truncated stream: missing end-of-archive marker: %w", io.ErrUnexpectedEOF))
			}
			return nil
		}
		if err != nil && !(errors.Is(err, tar.ErrInsecurePath) && hdr != nil) {
			return refuse("", archive.ReasonBadStream, fmt.Errorf("read tar header: %w", err))
		}
		if err := si.entry(hdr, tr); err != nil {
			return err
		}
	}
}

func (si *streamImporter) entry(hdr *tar.Header, tr *tar.Reader) error {
	si.entries++
	if si.entries > si.limits.MaxEntries {
		return refuse(hdr.Name, archive.ReasonTooManyEntries, fmt.Errorf("stream has more than %d entries", si.limits.MaxEntries))
	}
	name, reason, err := archive.CleanEntryName(hdr.Name, si.limits.MaxPathBytes)
	if err != nil {
		return refuse(hdr.Name, reason, err)
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return refuse(hdr.Name, archive.ReasonUnsupportedEntry, errors.New("non-directory entry for the root"))
		}
		return nil // the root's own mode and times are the store's
	}
	if hdr.Typeflag == tar.TypeReg && hdr.Size > si.limits.MaxFileBytes {
		return refuse(hdr.Name, archive.ReasonFileTooLarge, fmt.Errorf("file of %d bytes exceeds limit of %d", hdr.Size, si.limits.MaxFileBytes))
	}
	if hdr.Typeflag == tar.TypeReg && hdr.Size > si.limits.MaxBytes-si.bytes {
		return refuse(hdr.Name, archive.ReasonTooManyBytes, fmt.Errorf("stream exceeds %d bytes of file data", si.limits.MaxBytes))
	}
	if !isValidName(name) {
		// What ImportDir skips: the whiteout namespace, invalid UTF-8.
		si.report.Skipped = append(si.report.Skipped, Drop{Path: name, Reason: DropInvalidPath})
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return si.dir(hdr, name)
	case tar.TypeReg:
		return si.file(hdr, tr, name)
	case tar.TypeSymlink:
		return si.symlink(hdr, name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		si.report.Skipped = append(si.report.Skipped, Drop{Path: name, Reason: DropSpecialFile})
		return nil
	default:
		return refuse(hdr.Name, archive.ReasonUnsupportedEntry, fmt.Errorf("unsupported tar entry type %q in a workspace import", hdr.Typeflag))
	}
}

// parentOf returns the open descriptor of name's parent directory, creating
// missing ancestors (0755) as an unpacker would. A symlink or a
// non-directory on the way is refused.
func (si *streamImporter) parentOf(name string) (int, error) {
	dir := path.Dir(name)
	if dir == "." {
		return si.root, nil
	}
	if fd, ok := si.dirs[dir]; ok {
		return fd, nil
	}
	if _, made := si.dirMeta[dir]; made {
		return si.openDir(dir)
	}
	if err := si.mkdir(dir, 0o755, time.Time{}, false); err != nil {
		return -1, err
	}
	return si.openDir(dir)
}

// maxOpenDirs bounds the descriptors the importer keeps.
const maxOpenDirs = 1024

// openDir opens a directory the import made (beneath the root, no symlink
// followed) and keeps its descriptor for the entries that follow.
func (si *streamImporter) openDir(name string) (int, error) {
	if fd, ok := si.dirs[name]; ok {
		return fd, nil
	}
	if len(si.dirs) >= maxOpenDirs {
		si.closeDirs()
	}
	fd, err := unix.Openat2(si.root, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: ResolveBeneath})
	if err != nil {
		return -1, si.ioErr(name, err)
	}
	si.dirs[name] = fd
	return fd, nil
}

func (si *streamImporter) dir(hdr *tar.Header, name string) error {
	return si.mkdir(name, uint32(hdr.Mode)&0o777, hdr.ModTime, true)
}

// mkdir makes name (its ancestors first) and records its mode; explicit
// is a header of the stream (a repeated directory header: the last wins).
func (si *streamImporter) mkdir(name string, perm uint32, mtime time.Time, explicit bool) error {
	if _, ok := si.dirMeta[name]; ok {
		if !explicit {
			return nil
		}
		si.dirMeta[name] = importDirMeta{perm: perm, mtime: mtime}
		si.mu.Lock()
		si.recs[name] = digestRec{name, "dir", fmt.Sprintf("%04o", perm), ""}
		si.mu.Unlock()
		return nil
	}
	if k, ok := si.kind[name]; ok {
		if k == "symlink" {
			return refuse(name, archive.ReasonSymlinkInPath, errors.New("path goes through a symlink"))
		}
		return refuse(name, archive.ReasonParentNotDir, errors.New("a file of the stream is used as a directory"))
	}
	pfd, err := si.parentOf(name)
	if err != nil {
		return err
	}
	base := path.Base(name)
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		return si.ioErr(name, err)
	}
	si.dirMeta[name] = importDirMeta{perm: perm, mtime: mtime}
	si.mu.Lock()
	si.recs[name] = digestRec{name, "dir", fmt.Sprintf("%04o", perm), ""}
	si.mu.Unlock()
	return nil
}

// ioErr names a refused write: an entry that exists already is a repeated
// entry, one beneath a symlink or a file is refused as such.
func (si *streamImporter) ioErr(name string, err error) error {
	switch {
	case errors.Is(err, unix.EEXIST):
		return refuse(name, archive.ReasonDuplicateEntry, errors.New("entry repeated, or a directory and a file of one name"))
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return refuse(name, archive.ReasonSymlinkInPath, errors.New("path goes through a symlink"))
	case errors.Is(err, unix.ENOTDIR):
		return refuse(name, archive.ReasonParentNotDir, errors.New("parent is not a directory"))
	}
	return &archive.ApplyError{Path: name, Reason: archive.ReasonIO, Phase: archive.PhaseApply, Err: err}
}

func (si *streamImporter) file(hdr *tar.Header, tr *tar.Reader, name string) error {
	pfd, err := si.parentOf(name)
	if err != nil {
		return err
	}
	if _, ok := si.dirMeta[name]; ok {
		return refuse(name, archive.ReasonDuplicateEntry, errors.New("a directory and a file of one name"))
	}
	if _, ok := si.kind[name]; ok {
		return refuse(name, archive.ReasonDuplicateEntry, errors.New("entry repeated"))
	}
	si.kind[name] = "file"
	perm := uint32(hdr.Mode) & 0o777
	if hdr.Size <= importInlineMax {
		data, err := io.ReadAll(io.LimitReader(tr, importInlineMax+1))
		switch {
		case err != nil:
			return refuse(name, archive.ReasonBadStream, fmt.Errorf("read file data: %w", err))
		case int64(len(data)) != hdr.Size:
			return refuse(name, archive.ReasonBadStream, fmt.Errorf("file data of %d bytes, header says %d", len(data), hdr.Size))
		}
		si.bytes += int64(len(data))
		si.jobs <- fileJob{name: name, data: data, perm: perm, mtime: hdr.ModTime}
		return nil
	}
	fd, err := unix.Openat(pfd, path.Base(name), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return si.ioErr(name, err)
	}
	h := sha256.New()
	hw := newHoleWriter(fd)
	var n int64
	werr := func() error {
		for {
			k, rerr := tr.Read(si.buf)
			if k > 0 {
				h.Write(si.buf[:k])
				if _, err := hw.Write(si.buf[:k]); err != nil {
					return &archive.ApplyError{Path: name, Reason: archive.ReasonIO, Phase: archive.PhaseApply, Err: err}
				}
				n += int64(k)
			}
			if errors.Is(rerr, io.EOF) {
				if err := hw.Close(); err != nil {
					return &archive.ApplyError{Path: name, Reason: archive.ReasonIO, Phase: archive.PhaseApply, Err: err}
				}
				return nil
			}
			if rerr != nil {
				return refuse(name, archive.ReasonBadStream, fmt.Errorf("read file data: %w", rerr))
			}
		}
	}()
	if werr == nil {
		werr = unix.Fchmod(fd, perm)
	}
	if werr == nil {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
	}
	if cerr := unix.Close(fd); werr == nil && cerr != nil {
		werr = cerr
	}
	if werr != nil {
		return werr
	}
	si.bytes += n
	si.mu.Lock()
	si.sizes[name] = n
	si.recs[name] = digestRec{name, "file", fmt.Sprintf("%04o", perm), hex.EncodeToString(h.Sum(nil))}
	si.mu.Unlock()
	return nil
}

// processUmask reads the umask from /proc/self/status (setting it to read
// it would race with other goroutines creating files); -1 when unknown.
func processUmask() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Umask:"); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return int(n)
			}
		}
	}
	return -1
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func (si *streamImporter) symlink(hdr *tar.Header, name string) error {
	switch {
	case hdr.Linkname == "":
		return refuse(name, archive.ReasonUnsupportedEntry, errors.New("symlink with empty target"))
	case strings.IndexByte(hdr.Linkname, 0) >= 0:
		return refuse(name, archive.ReasonNULInName, errors.New("NUL byte in symlink target"))
	case len(hdr.Linkname) > si.limits.MaxPathBytes:
		return refuse(name, archive.ReasonPathTooLong, errors.New("symlink target too long"))
	}
	pfd, err := si.parentOf(name)
	if err != nil {
		return err
	}
	if _, ok := si.dirMeta[name]; ok {
		return refuse(name, archive.ReasonDuplicateEntry, errors.New("a directory and a symlink of one name"))
	}
	if _, ok := si.kind[name]; ok {
		return refuse(name, archive.ReasonDuplicateEntry, errors.New("entry repeated"))
	}
	si.kind[name] = "symlink"
	base := path.Base(name)
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return si.ioErr(name, err)
	}
	// As ImportDir sets them (lutimes: to the microsecond).
	tv := unix.NsecToTimeval(hdr.ModTime.UnixNano())
	ts := []unix.Timespec{unix.NsecToTimespec(unix.TimevalToNsec(tv)), unix.NsecToTimespec(unix.TimevalToNsec(tv))}
	_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	si.mu.Lock()
	si.recs[name] = digestRec{name, "symlink", "", hdr.Linkname}
	si.mu.Unlock()
	return nil
}

// finishDirs applies the directories' modes and mtimes once everything
// beneath them is written (deepest first, so a parent's mtime is final).
func (si *streamImporter) finishDirs() error {
	names := make([]string, 0, len(si.dirMeta))
	for n := range si.dirMeta {
		names = append(names, n)
	}
	sortDeepestFirst(names)
	for _, n := range names {
		m := si.dirMeta[n]
		fd, err := unix.Openat2(si.root, n, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: ResolveBeneath})
		if err != nil {
			return si.ioErr(n, err)
		}
		err = unix.Fchmod(fd, m.perm)
		if err == nil && !m.mtime.IsZero() {
			ts := []unix.Timespec{unix.NsecToTimespec(m.mtime.UnixNano()), unix.NsecToTimespec(m.mtime.UnixNano())}
			_ = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return si.ioErr(n, err)
		}
	}
	return nil
}

func sortDeepestFirst(names []string) {
	depth := func(s string) int { return strings.Count(s, "/") }
	sort.Slice(names, func(i, j int) bool {
		if di, dj := depth(names[i]), depth(names[j]); di != dj {
			return di > dj
		}
		return names[i] < names[j]
	})
}

func (si *streamImporter) closeDirs() {
	for n, fd := range si.dirs {
		unix.Close(fd)
		delete(si.dirs, n)
	}
}

// keepOnly prunes the written tree to what ImportDir's git-aware copy
// takes: the listed paths that exist (a listed directory whole), their
// ancestors, and nothing else.
func (si *streamImporter) keepOnly(tmp string, listed []string) error {
	keep := map[string]bool{}
	anc := map[string]bool{}
	for _, p := range listed {
		if _, ok := si.recs[p]; !ok {
			continue // listed by the index but not in the tree
		}
		keep[p] = true
		for _, a := range ancestors(p) {
			anc[a] = true
		}
	}
	var drop []string
	for p := range si.recs {
		if !nearPath(p, keep, anc, keep) {
			drop = append(drop, p)
		}
	}
	sort.Strings(drop) // a directory before what is beneath it (gone with it)
	for _, p := range drop {
		delete(si.recs, p)
		delete(si.dirMeta, p)
		if err := removeAll(fullPath(tmp, p)); err != nil {
			return err
		}
	}
	skipped := si.report.Skipped[:0]
	for _, s := range si.report.Skipped {
		if nearPath(s.Path, keep, anc, keep) {
			skipped = append(skipped, s)
		}
	}
	si.report.Skipped = skipped
	return nil
}
