package archive

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// ApplyLimits caps what a stream may contain. Zero (or negative) fields mean
// the corresponding DefaultApplyLimits value.
type ApplyLimits struct {
	MaxEntries   int   // tar headers of any kind, default 1_000_000
	MaxBytes     int64 // total regular-file bytes (hardlink copies included), default 64 GiB
	MaxFileBytes int64 // one regular file, default 16 GiB
	MaxPathBytes int   // entry names and link targets, default 4096
}

// DefaultApplyLimits are the limits used for zero ApplyLimits fields.
var DefaultApplyLimits = ApplyLimits{
	MaxEntries:   1_000_000,
	MaxBytes:     64 << 30,
	MaxFileBytes: 16 << 30,
	MaxPathBytes: 4096,
}

func (l ApplyLimits) withDefaults() ApplyLimits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultApplyLimits.MaxEntries
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultApplyLimits.MaxBytes
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = DefaultApplyLimits.MaxFileBytes
	}
	if l.MaxPathBytes <= 0 {
		l.MaxPathBytes = DefaultApplyLimits.MaxPathBytes
	}
	return l
}

// ApplyMode selects how a stream is interpreted.
type ApplyMode int

const (
	// ApplyChanges applies a change layer: whiteouts and opaque markers are
	// allowed and applied, existing files are replaced.
	ApplyChanges ApplyMode = iota
	// ApplyImport imports a base tree: whiteouts are rejected, special files
	// are skipped and reported, dest must be empty or absent.
	ApplyImport
)

// ApplyOptions configures ApplyTar.
type ApplyOptions struct {
	Mode   ApplyMode
	Limits ApplyLimits
	// OpenDest, when set, opens dest (a directory descriptor the apply then
	// owns) in place of opening it by path: create false before the
	// stream is read (an error wrapping fs.ErrNotExist: dest is made after
	// the stream is checked), create true to make it. A host's export
	// passes one that refuses a symlink anywhere in dest at the moment it
	// is opened (hostpath.OpenDir): dest was checked by path before, and
	// what did not exist then may be a symlink by now.
	OpenDest func(create bool) (int, error)
}

// ApplyReport counts what was applied; JSON names match the product's
// export_changes result.
//
// DeletesApplied counts whiteouts that actually removed an existing dest
// entry (a whiteout for a path that is absent, or lies inside a directory
// that this stream replaces or clears anyway, is not counted). OpaqueClears
// counts opaque markers applied to a directory that existed in dest, whether
// or not it had contents. DirsCreated includes parent directories created
// implicitly. Hardlinks are applied as copies and counted in FilesWritten.
type ApplyReport struct {
	FilesWritten     int            `json:"files_written"`
	SymlinksWritten  int            `json:"symlinks_written"`
	DirsCreated      int            `json:"dirs_created"`
	DeletesApplied   int            `json:"deletes_applied"`
	OpaqueClears     int            `json:"opaque_clears"`
	SkippedUnchanged int            `json:"skipped_unchanged"`
	BytesWritten     int64          `json:"bytes_written"`
	Skipped          []SkippedEntry `json:"skipped,omitempty"`
}

// SkippedEntry is a stream entry that was deliberately not applied.
type SkippedEntry struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// SkipReasonSpecialFile marks FIFOs and device nodes skipped in ApplyImport.
const SkipReasonSpecialFile = "unsupported_special_file"

// ApplyError phases.
const (
	PhaseValidate = "validate" // nothing was applied; dest is untouched
	PhaseApply    = "apply"    // dest may be partially updated
)

// ApplyError reasons (stable snake_case strings).
const (
	ReasonAbsolutePath       = "absolute_path"
	ReasonParentTraversal    = "parent_traversal"
	ReasonNULInName          = "nul_in_name"
	ReasonPathTooLong        = "path_too_long"
	ReasonTooManyEntries     = "too_many_entries"
	ReasonTooManyBytes       = "too_many_bytes"
	ReasonFileTooLarge       = "file_too_large"
	ReasonLinkEscapes        = "link_escapes"
	ReasonWhiteoutNotAllowed = "whiteout_not_allowed"
	ReasonBadWhiteout        = "bad_whiteout"
	ReasonDuplicateEntry     = "duplicate_entry"
	ReasonBadStream          = "bad_stream"
	ReasonSymlinkInPath      = "symlink_in_path"
	ReasonUnsupportedEntry   = "unsupported_entry"
	ReasonDestNotEmpty       = "dest_not_empty"
	// ReasonParentNotDir: an entry's parent is a non-directory (a file entry
	// earlier in the stream, or a non-directory in dest).
	ReasonParentNotDir = "parent_not_dir"
	// ReasonCanceled: ctx was canceled; Err wraps ctx.Err().
	ReasonCanceled = "canceled"
	// ReasonIO: a local I/O failure (spool, dest) not caused by the stream.
	ReasonIO = "io_error"
)

// ApplyError is a structured rejection of the stream or failure to apply it.
// Nothing was applied when Phase == PhaseValidate.
type ApplyError struct {
	Path   string // entry name as it appeared (sanitized for printing)
	Reason string // one of the Reason* constants
	Phase  string // PhaseValidate or PhaseApply
	Err    error
}

func (e *ApplyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "layerstack: apply tar: %s: %s", e.Phase, e.Reason)
	if e.Path != "" {
		fmt.Fprintf(&b, " at \"%s\"", e.Path)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *ApplyError) Unwrap() error { return e.Err }

const applyMaxPrintedPath = 256

// sanitizeApplyPath makes an untrusted name safe to print: bounded length, no
// control characters or invalid UTF-8.
func sanitizeApplyPath(s string) string {
	if len(s) > applyMaxPrintedPath {
		s = s[:applyMaxPrintedPath] + "..."
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

func newApplyError(phase, name, reason string, err error) *ApplyError {
	return &ApplyError{Path: sanitizeApplyPath(name), Reason: reason, Phase: phase, Err: err}
}

func applyValidateErr(name, reason string, err error) *ApplyError {
	return newApplyError(PhaseValidate, name, reason, err)
}

// ApplyTar reads a tar or tar.zst stream (zstd is detected by its magic bytes)
// from r, validates all of it, and then applies it to dest. See the file
// comment for the safety model. dest is created if absent.
//
// The stream must end with the tar end-of-archive marker; up to 1 MiB after
// it (normally zero padding) is read and discarded so that a damaged
// compressed tail is detected. Regular-file contents are spooled to an
// unlinked file in os.TempDir, which needs room for them. Existing dest files
// are replaced by unlinking and creating anew (never truncated in place, so
// other hardlinks to them are unaffected); a file already equal in mode, size
// and contents is left alone, mtime included. Uid and gid are not applied.
// ctx is checked between entries; a Read blocked inside r is not interrupted.
//
// On error the returned report describes what was applied before the failure;
// errors are always *ApplyError.
func ApplyTar(ctx context.Context, r io.Reader, dest string, opts ApplyOptions) (ApplyReport, error) {
	limits := opts.Limits.withDefaults()
	root, err := applyOpenDest(dest, opts)
	if err != nil {
		return ApplyReport{}, err
	}
	defer func() { applyCloseFD(root) }()

	spool, err := newApplySpool()
	if err != nil {
		return ApplyReport{}, applyValidateErr("", ReasonIO, err)
	}
	defer spool.Close()

	v := newTarValidator(ctx, opts.Mode, limits, spool, root)
	if err := v.run(r); err != nil {
		return ApplyReport{}, err
	}

	if root < 0 {
		if root, err = applyCreateDest(dest, opts); err != nil {
			return ApplyReport{}, err
		}
	}
	a := newTarApplier(ctx, root, spool, v.entries)
	a.report.Skipped = v.skipped
	err = a.run()
	return a.report, err
}

// applyOpenDest opens dest for validation; -1 means dest does not exist yet.
func applyOpenDest(dest string, opts ApplyOptions) (int, error) {
	var fd int
	var err error
	if opts.OpenDest != nil {
		fd, err = opts.OpenDest(false)
		if errors.Is(err, fs.ErrNotExist) {
			return -1, nil
		}
		if err != nil {
			return -1, applyValidateErr("", ReasonIO, fmt.Errorf("open dest %s: %w", dest, err))
		}
	} else {
		fd, err = unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			return -1, nil
		}
		if err != nil {
			return -1, applyValidateErr("", ReasonIO, fmt.Errorf("open dest %s: %w", dest, err))
		}
	}
	if opts.Mode == ApplyImport {
		empty, err := applyDirIsEmpty(fd)
		if err == nil && !empty {
			err = applyValidateErr("", ReasonDestNotEmpty, fmt.Errorf("import into non-empty %s", dest))
		} else if err != nil {
			err = applyValidateErr("", ReasonIO, fmt.Errorf("read dest %s: %w", dest, err))
		}
		if err != nil {
			applyCloseFD(fd)
			return -1, err
		}
	}
	return fd, nil
}

func applyCreateDest(dest string, opts ApplyOptions) (int, error) {
	if opts.OpenDest != nil {
		fd, err := opts.OpenDest(true)
		if err != nil {
			return -1, newApplyError(PhaseApply, "", ReasonIO, fmt.Errorf("create dest %s: %w", dest, err))
		}
		return fd, nil
	}
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return -1, newApplyError(PhaseApply, "", ReasonIO, fmt.Errorf("create dest: %w", err))
	}
	fd, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, newApplyError(PhaseApply, "", ReasonIO, fmt.Errorf("open dest %s: %w", dest, err))
	}
	return fd, nil
}

// applyDirIsEmpty reports whether the directory open at fd has no entries.
func applyDirIsEmpty(fd int) (bool, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	f := os.NewFile(uintptr(dup), ".")
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0, err
}

// newApplySpool creates an already-unlinked temp file for file contents.
func newApplySpool() (*os.File, error) {
	f, err := os.CreateTemp("", "layerstack-apply-*.spool")
	if err != nil {
		return nil, fmt.Errorf("create spool: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("unlink spool: %w", err)
	}
	return f, nil
}

func applyCloseFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// ---------------------------------------------------------------------------
// Validation: parse, check and spool the whole stream.

type applyEntryKind uint8

const (
	aeFile applyEntryKind = iota + 1 // regular file or hardlink copy
	aeDir
	aeSymlink
	aeWhiteout // name is the path to delete
	aeOpaque   // name is the directory to clear
)

// applyEntry is one validated action, kept in memory between the phases.
type applyEntry struct {
	name   string // cleaned, relative to dest ("." only for entOpaque)
	kind   applyEntryKind
	parent int32 // tree node of the parent directory
	node   int32 // tree node of name
	perm   uint32
	mtime  time.Time
	off    int64 // file contents in the spool
	size   int64
	target string // symlink target
	skip   bool   // deletion inside a directory this stream recreates anyway
}

const (
	tarWhiteoutPrefix     = ".wh."
	tarWhiteoutMetaPrefix = ".wh..wh."
	tarOpaqueMarker       = ".wh..wh..opq"
	tarMaxNameComponent   = 255 // NAME_MAX
	tarBlockSize          = 512
	tarMaxTrailingBytes   = 1 << 20 // padding tolerated after the end-of-archive marker
	tarZstdMaxWindow      = 128 << 20
	tarCopyBufSize        = 128 << 10
)

var tarZstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

type tarValidator struct {
	ctx      context.Context
	mode     ApplyMode
	limits   ApplyLimits
	spool    *os.File
	spoolOff int64
	root     int // dest, or -1 if absent
	nEntries int
	nBytes   int64
	tree     *tarPathTree
	entries  []applyEntry
	skipped  []SkippedEntry
	buf      []byte
}

func newTarValidator(ctx context.Context, mode ApplyMode, limits ApplyLimits, spool *os.File, root int) *tarValidator {
	return &tarValidator{
		ctx: ctx, mode: mode, limits: limits, spool: spool, root: root,
		tree: newTarPathTree(), buf: make([]byte, tarCopyBufSize),
	}
}

// run validates the stream from r and then checks it against dest.
func (v *tarValidator) run(r io.Reader) error {
	src, closeSrc, err := tarDecompressed(r)
	if err != nil {
		return err
	}
	defer closeSrc()
	if err := v.readAll(src); err != nil {
		return err
	}
	return v.checkDest()
}

// tarDecompressed returns r, or a zstd decoder over it if it starts with the
// zstd magic.
func tarDecompressed(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(len(tarZstdMagic))
	if !bytes.Equal(magic, tarZstdMagic) {
		return br, func() {}, nil
	}
	dec, err := zstd.NewReader(br,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxWindow(tarZstdMaxWindow))
	if err != nil {
		return nil, nil, applyValidateErr("", ReasonBadStream, fmt.Errorf("zstd: %w", err))
	}
	return dec, dec.Close, nil
}

// tarCountingReader counts the bytes the tar reader consumed, which lets us
// tell a proper end-of-archive marker from a stream cut at a block boundary.
type tarCountingReader struct {
	r io.Reader
	n int64
}

func (c *tarCountingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (v *tarValidator) readAll(src io.Reader) error {
	cr := &tarCountingReader{r: src}
	tr := tar.NewReader(cr)
	for {
		if err := v.ctx.Err(); err != nil {
			return applyValidateErr("", ReasonCanceled, err)
		}
		// Every entry's data was fully read, so the next header starts at
		// the block boundary following the data.
		entryEnd := tarRoundUpBlock(cr.n)
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tarCheckTrailer(src, cr.n-entryEnd)
		}
		if err != nil && !(errors.Is(err, tar.ErrInsecurePath) && hdr != nil) {
			return applyValidateErr("", ReasonBadStream, fmt.Errorf("read tar header: %w", err))
		}
		if err := v.handle(hdr, tr); err != nil {
			return err
		}
	}
}

func tarRoundUpBlock(n int64) int64 {
	return (n + tarBlockSize - 1) / tarBlockSize * tarBlockSize
}

// tarCheckTrailer requires the two zero blocks that end an archive, then drains
// a bounded amount of padding so that a corrupt compressed tail is noticed.
func tarCheckTrailer(src io.Reader, trailer int64) error {
	if trailer != 2*tarBlockSize {
		return applyValidateErr("", ReasonBadStream,
			fmt.Errorf("truncated stream: missing end-of-archive marker: %w", io.ErrUnexpectedEOF))
	}
	n, err := io.Copy(io.Discard, io.LimitReader(src, tarMaxTrailingBytes+1))
	if err != nil {
		return applyValidateErr("", ReasonBadStream, fmt.Errorf("read after end of archive: %w", err))
	}
	if n > tarMaxTrailingBytes {
		return applyValidateErr("", ReasonBadStream, errors.New("too much data after end of archive"))
	}
	return nil
}

func (v *tarValidator) handle(hdr *tar.Header, tr *tar.Reader) error {
	v.nEntries++
	if v.nEntries > v.limits.MaxEntries {
		return applyValidateErr(hdr.Name, ReasonTooManyEntries,
			fmt.Errorf("stream has more than %d entries", v.limits.MaxEntries))
	}
	name, reason, err := cleanTarName(hdr.Name, v.limits.MaxPathBytes)
	if err != nil {
		return applyValidateErr(hdr.Name, reason, err)
	}
	if err := v.chargeBytes(hdr); err != nil {
		return err
	}
	base, dir := path.Base(name), path.Dir(name)
	if strings.HasPrefix(base, tarWhiteoutPrefix) || tarHasWhiteoutComponent(dir) {
		return v.addWhiteout(hdr, tr, name)
	}
	switch hdr.Typeflag {
	case tar.TypeReg:
		return v.addFile(hdr, tr, name)
	case tar.TypeDir:
		return v.addDir(hdr, name)
	case tar.TypeSymlink:
		return v.addSymlink(hdr, name)
	case tar.TypeLink:
		return v.addHardlink(hdr, name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return v.addSpecial(hdr, name)
	default:
		return applyValidateErr(hdr.Name, ReasonUnsupportedEntry,
			fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag))
	}
}

// chargeBytes applies the size limits to every entry that carries data.
func (v *tarValidator) chargeBytes(hdr *tar.Header) error {
	if tarHeaderOnly(hdr.Typeflag) || hdr.Size <= 0 {
		return nil
	}
	if hdr.Typeflag == tar.TypeReg && hdr.Size > v.limits.MaxFileBytes {
		return applyValidateErr(hdr.Name, ReasonFileTooLarge,
			fmt.Errorf("file of %d bytes exceeds limit of %d", hdr.Size, v.limits.MaxFileBytes))
	}
	return v.charge(hdr.Name, hdr.Size)
}

func (v *tarValidator) charge(name string, n int64) error {
	if n > v.limits.MaxBytes-v.nBytes {
		return applyValidateErr(name, ReasonTooManyBytes,
			fmt.Errorf("stream exceeds %d bytes of file data", v.limits.MaxBytes))
	}
	v.nBytes += n
	return nil
}

func tarHeaderOnly(t byte) bool {
	switch t {
	case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
		return true
	}
	return false
}

// cleanTarName normalizes an entry name to a clean relative path. On failure it
// returns the rejection reason and an error.
func cleanTarName(raw string, maxBytes int) (string, string, error) {
	if strings.IndexByte(raw, 0) >= 0 {
		return "", ReasonNULInName, errors.New("NUL byte in name")
	}
	if len(raw) > maxBytes {
		return "", ReasonPathTooLong, fmt.Errorf("name of %d bytes exceeds limit of %d", len(raw), maxBytes)
	}
	if strings.HasPrefix(raw, "/") {
		return "", ReasonAbsolutePath, errors.New("absolute name")
	}
	for comp := range strings.SplitSeq(raw, "/") {
		if comp == ".." {
			return "", ReasonParentTraversal, errors.New("name has a .. component")
		}
		if len(comp) > tarMaxNameComponent {
			return "", ReasonPathTooLong, fmt.Errorf("name component longer than %d bytes", tarMaxNameComponent)
		}
	}
	return path.Clean(raw), "", nil
}

func tarHasWhiteoutComponent(dir string) bool {
	for comp := range strings.SplitSeq(dir, "/") {
		if strings.HasPrefix(comp, tarWhiteoutPrefix) {
			return true
		}
	}
	return false
}

// tarDiscard reads the rest of the current entry so that the next header starts
// at a known offset; a read failure is a broken stream.
func tarDiscard(tr *tar.Reader, name string) error {
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return applyValidateErr(name, ReasonBadStream, fmt.Errorf("read entry data: %w", err))
	}
	return nil
}

func (v *tarValidator) addWhiteout(hdr *tar.Header, tr *tar.Reader, name string) error {
	if v.mode == ApplyImport {
		return applyValidateErr(hdr.Name, ReasonWhiteoutNotAllowed, errors.New("whiteout in a base import"))
	}
	base, dir := path.Base(name), path.Dir(name)
	if tarHasWhiteoutComponent(dir) {
		return applyValidateErr(hdr.Name, ReasonBadWhiteout, errors.New("whiteout name used as a directory"))
	}
	if err := tarDiscard(tr, hdr.Name); err != nil {
		return err
	}
	if base == tarOpaqueMarker {
		return v.addOpaque(hdr, dir)
	}
	target := strings.TrimPrefix(base, tarWhiteoutPrefix)
	if strings.HasPrefix(base, tarWhiteoutMetaPrefix) || target == "" || target == "." || target == ".." {
		return applyValidateErr(hdr.Name, ReasonBadWhiteout, fmt.Errorf("invalid whiteout %q", base))
	}
	parent, reason, err := v.tree.dirChain(dir)
	if err != nil {
		return applyValidateErr(hdr.Name, reason, err)
	}
	node := v.tree.child(parent, target)
	if v.tree.nodes[node].whited {
		return applyValidateErr(hdr.Name, ReasonDuplicateEntry, errors.New("whiteout repeated"))
	}
	v.tree.nodes[node].whited = true
	v.entries = append(v.entries, applyEntry{name: path.Join(dir, target), kind: aeWhiteout, parent: parent, node: node})
	return nil
}

func (v *tarValidator) addOpaque(hdr *tar.Header, dir string) error {
	node, reason, err := v.tree.dirChain(dir)
	if err != nil {
		return applyValidateErr(hdr.Name, reason, err)
	}
	if v.tree.nodes[node].opaque {
		return applyValidateErr(hdr.Name, ReasonDuplicateEntry, errors.New("opaque marker repeated"))
	}
	v.tree.nodes[node].opaque = true
	v.entries = append(v.entries, applyEntry{name: dir, kind: aeOpaque, parent: v.tree.nodes[node].parent, node: node})
	return nil
}

func tarHeaderPerm(hdr *tar.Header) uint32 {
	// setuid, setgid and sticky are dropped on purpose.
	return uint32(hdr.Mode) & 0o777
}

// addLeaf registers name in the tree, rejecting duplicates and conflicts.
func (v *tarValidator) addLeaf(hdr *tar.Header, name string, kind tarNodeKind) (parent, node int32, err error) {
	if name == "." {
		return 0, 0, applyValidateErr(hdr.Name, ReasonUnsupportedEntry, errors.New("non-directory entry for the root"))
	}
	parent, node, reason, err := v.tree.addLeaf(name, kind)
	if err != nil {
		return 0, 0, applyValidateErr(hdr.Name, reason, err)
	}
	return parent, node, nil
}

func (v *tarValidator) addFile(hdr *tar.Header, tr *tar.Reader, name string) error {
	parent, node, err := v.addLeaf(hdr, name, tnFile)
	if err != nil {
		return err
	}
	off := v.spoolOff
	n, err := v.spoolData(hdr.Name, tr)
	if err != nil {
		return err
	}
	v.tree.nodes[node].entry = int32(len(v.entries))
	v.entries = append(v.entries, applyEntry{
		name: name, kind: aeFile, parent: parent, node: node,
		perm: tarHeaderPerm(hdr), mtime: hdr.ModTime, off: off, size: n,
	})
	return nil
}

// spoolData copies the current entry's contents to the spool.
func (v *tarValidator) spoolData(name string, tr *tar.Reader) (int64, error) {
	var total int64
	for {
		n, rerr := tr.Read(v.buf)
		if n > 0 {
			if _, err := v.spool.WriteAt(v.buf[:n], v.spoolOff); err != nil {
				return 0, applyValidateErr(name, ReasonIO, fmt.Errorf("write spool: %w", err))
			}
			v.spoolOff += int64(n)
			total += int64(n)
		}
		if errors.Is(rerr, io.EOF) {
			return total, nil
		}
		if rerr != nil {
			return 0, applyValidateErr(name, ReasonBadStream, fmt.Errorf("read file data: %w", rerr))
		}
	}
}

func (v *tarValidator) addDir(hdr *tar.Header, name string) error {
	if name == "." {
		// The root entry ("./") carries nothing we apply: dest's own mode
		// and times are the caller's, not the stream's.
		return nil
	}
	parent, node, err := v.addLeaf(hdr, name, tnDir)
	if err != nil {
		return err
	}
	e := applyEntry{name: name, kind: aeDir, parent: parent, node: node, perm: tarHeaderPerm(hdr), mtime: hdr.ModTime}
	if idx := v.tree.nodes[node].entry; idx >= 0 {
		v.entries[idx] = e // a repeated directory: the last header wins
		return nil
	}
	v.tree.nodes[node].entry = int32(len(v.entries))
	v.entries = append(v.entries, e)
	return nil
}

func (v *tarValidator) addSymlink(hdr *tar.Header, name string) error {
	switch {
	case hdr.Linkname == "":
		return applyValidateErr(hdr.Name, ReasonUnsupportedEntry, errors.New("symlink with empty target"))
	case strings.IndexByte(hdr.Linkname, 0) >= 0:
		return applyValidateErr(hdr.Name, ReasonNULInName, errors.New("NUL byte in symlink target"))
	case len(hdr.Linkname) > v.limits.MaxPathBytes:
		return applyValidateErr(hdr.Name, ReasonPathTooLong, errors.New("symlink target too long"))
	}
	parent, node, err := v.addLeaf(hdr, name, tnSymlink)
	if err != nil {
		return err
	}
	v.entries = append(v.entries, applyEntry{
		name: name, kind: aeSymlink, parent: parent, node: node,
		mtime: hdr.ModTime, target: hdr.Linkname,
	})
	return nil
}

// addHardlink accepts a hardlink only to an earlier regular file of this
// stream; it is applied as a copy of that file's contents.
func (v *tarValidator) addHardlink(hdr *tar.Header, name string) error {
	target, reason, err := cleanTarName(hdr.Linkname, v.limits.MaxPathBytes)
	if err != nil {
		if reason == ReasonAbsolutePath || reason == ReasonParentTraversal {
			reason = ReasonLinkEscapes
		}
		return applyValidateErr(hdr.Name, reason, fmt.Errorf("hardlink target: %w", err))
	}
	src := v.tree.lookup(target)
	if src < 0 || (v.tree.nodes[src].kind != tnFile && v.tree.nodes[src].kind != tnHardlink) {
		return applyValidateErr(hdr.Name, ReasonLinkEscapes,
			fmt.Errorf("hardlink target %q is not an earlier file of this stream", sanitizeApplyPath(hdr.Linkname)))
	}
	orig := v.entries[v.tree.nodes[src].entry]
	if err := v.charge(hdr.Name, orig.size); err != nil {
		return err
	}
	parent, node, err := v.addLeaf(hdr, name, tnHardlink)
	if err != nil {
		return err
	}
	v.tree.nodes[node].entry = int32(len(v.entries))
	v.entries = append(v.entries, applyEntry{
		name: name, kind: aeFile, parent: parent, node: node,
		perm: orig.perm, mtime: orig.mtime, off: orig.off, size: orig.size,
	})
	return nil
}

func (v *tarValidator) addSpecial(hdr *tar.Header, name string) error {
	if v.mode != ApplyImport {
		return applyValidateErr(hdr.Name, ReasonUnsupportedEntry,
			fmt.Errorf("special file (type %q) in a change layer", hdr.Typeflag))
	}
	if _, _, err := v.addLeaf(hdr, name, tnSpecial); err != nil {
		return err
	}
	v.skipped = append(v.skipped, SkippedEntry{Path: sanitizeApplyPath(name), Reason: SkipReasonSpecialFile})
	return nil
}

// ---------------------------------------------------------------------------
// The stream's path tree, and its check against dest.

type tarNodeKind uint8

const (
	tnNone    tarNodeKind = iota // only named by a whiteout
	tnImplied                    // a parent of some entry, no entry of its own
	tnDir
	tnFile
	tnHardlink
	tnSymlink
	tnSpecial
)

// tarDestState says what a directory of the stream will hold when entries are
// written into it.
type tarDestState uint8

const (
	tdsUnknown  tarDestState = iota
	tdsDestReal              // an existing dest directory, kept with its contents
	tdsFresh                 // absent, replaced or cleared: nothing of dest in it
)

type tarTreeEdge struct {
	parent int32
	name   string
}

type tarTreeNode struct {
	parent int32
	name   string
	kind   tarNodeKind
	whited bool // a whiteout names this path
	opaque bool // an opaque marker clears this directory
	state  tarDestState
	entry  int32 // index in entries, or -1
}

// tarPathTree records every path named by the stream, one node per component,
// so that duplicates and entries under symlinks or files are found in time
// linear in the name length.
type tarPathTree struct {
	nodes []tarTreeNode
	index map[tarTreeEdge]int32
}

func newTarPathTree() *tarPathTree {
	return &tarPathTree{
		nodes: []tarTreeNode{{parent: -1, name: ".", kind: tnDir, entry: -1}},
		index: make(map[tarTreeEdge]int32),
	}
}

func (t *tarPathTree) child(parent int32, name string) int32 {
	key := tarTreeEdge{parent, name}
	if id, ok := t.index[key]; ok {
		return id
	}
	id := int32(len(t.nodes))
	t.nodes = append(t.nodes, tarTreeNode{parent: parent, name: name, entry: -1})
	t.index[key] = id
	return id
}

// lookup finds the node of a clean relative path, or -1.
func (t *tarPathTree) lookup(p string) int32 {
	if p == "." {
		return 0
	}
	id := int32(0)
	for comp := range strings.SplitSeq(p, "/") {
		next, ok := t.index[tarTreeEdge{id, comp}]
		if !ok {
			return -1
		}
		id = next
	}
	return id
}

// dirChain marks every component of dir as a directory and returns dir's
// node, failing if one of them is a symlink or non-directory entry.
func (t *tarPathTree) dirChain(dir string) (int32, string, error) {
	id := int32(0)
	if dir == "." {
		return id, "", nil
	}
	for comp := range strings.SplitSeq(dir, "/") {
		id = t.child(id, comp)
		n := &t.nodes[id]
		switch n.kind {
		case tnNone:
			n.kind = tnImplied
		case tnImplied, tnDir:
		case tnSymlink:
			return 0, ReasonSymlinkInPath, fmt.Errorf("parent %q is a symlink of this stream", sanitizeApplyPath(t.pathOf(id)))
		default:
			return 0, ReasonParentNotDir, fmt.Errorf("parent %q is a non-directory of this stream", sanitizeApplyPath(t.pathOf(id)))
		}
	}
	return id, "", nil
}

func (t *tarPathTree) addLeaf(name string, kind tarNodeKind) (parent, id int32, reason string, err error) {
	parent, reason, err = t.dirChain(path.Dir(name))
	if err != nil {
		return 0, 0, reason, err
	}
	id = t.child(parent, path.Base(name))
	n := &t.nodes[id]
	switch {
	case n.kind == tnNone:
		n.kind = kind
	case kind == tnDir && (n.kind == tnImplied || n.kind == tnDir):
		n.kind = tnDir
	case n.kind == tnImplied && kind == tnSymlink:
		return 0, 0, ReasonSymlinkInPath, errors.New("symlink replaces a directory that earlier entries are in")
	case n.kind == tnImplied:
		return 0, 0, ReasonParentNotDir, errors.New("non-directory replaces a directory that earlier entries are in")
	default:
		return 0, 0, ReasonDuplicateEntry, errors.New("name appears twice")
	}
	return parent, id, "", nil
}

func (t *tarPathTree) pathOf(id int32) string {
	var comps []string
	for ; id > 0; id = t.nodes[id].parent {
		comps = append(comps, t.nodes[id].name)
	}
	if len(comps) == 0 {
		return "."
	}
	slices.Reverse(comps)
	return strings.Join(comps, "/")
}

// checkDest looks at dest (read-only) to reject, before anything is
// applied, streams that would write or delete through a symlink or a
// non-directory in dest, and to find deletions that are no-ops.
func (v *tarValidator) checkDest() error {
	if v.root < 0 {
		v.tree.nodes[0].state = tdsFresh
	} else {
		v.tree.nodes[0].state = tdsDestReal
	}
	for i := range v.entries {
		if err := v.ctx.Err(); err != nil {
			return applyValidateErr("", ReasonCanceled, err)
		}
		e := &v.entries[i]
		dirNode := e.parent
		if e.kind == aeOpaque {
			dirNode = e.node
		}
		st, err := v.stateOf(dirNode)
		if err != nil {
			return err
		}
		e.skip = st == tdsFresh && (e.kind == aeWhiteout || e.kind == aeOpaque)
	}
	return nil
}

// stateOf computes (and memoizes) the state of a directory node of the tree.
func (v *tarValidator) stateOf(id int32) (tarDestState, error) {
	n := v.tree.nodes[id]
	if n.state != tdsUnknown {
		return n.state, nil
	}
	ps, err := v.stateOf(n.parent)
	if err != nil {
		return 0, err
	}
	st := tdsFresh
	if ps == tdsDestReal && !n.whited && !v.tree.nodes[n.parent].opaque {
		if st, err = v.destDirState(id); err != nil {
			return 0, err
		}
	}
	v.tree.nodes[id].state = st
	return st, nil
}

// destDirState inspects the dest entry at a node whose parent is an existing
// dest directory.
func (v *tarValidator) destDirState(id int32) (tarDestState, error) {
	rel := v.tree.pathOf(id)
	var st unix.Stat_t
	err := tarLstatBeneath(v.root, rel, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return tdsFresh, nil
	case err != nil:
		return 0, applyValidateErr(rel, applyReasonForErrno(err), fmt.Errorf("inspect dest: %w", err))
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return tdsDestReal, nil
	case v.tree.nodes[id].kind == tnDir:
		return tdsFresh, nil // the stream's directory entry replaces it
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return 0, applyValidateErr(rel, ReasonSymlinkInPath, errors.New("parent is a symlink in dest"))
	default:
		return 0, applyValidateErr(rel, ReasonParentNotDir, errors.New("parent is a non-directory in dest"))
	}
}

// ---------------------------------------------------------------------------
// Safe *at helpers.

const tarResolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// tarOpenBeneath opens rel below root without following any symlink.
func tarOpenBeneath(root int, rel string, flags uint64) (int, error) {
	how := &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: tarResolveFlags}
	for range 16 {
		fd, err := unix.Openat2(root, rel, how)
		if err != unix.EAGAIN && err != unix.EINTR {
			return fd, err
		}
	}
	return -1, unix.EAGAIN
}

func tarOpenDirPath(root int, rel string) (int, error) {
	return tarOpenBeneath(root, rel, unix.O_PATH|unix.O_DIRECTORY)
}

// tarLstatBeneath stats rel without following symlinks anywhere in it.
func tarLstatBeneath(root int, rel string, st *unix.Stat_t) error {
	pfd, err := tarOpenDirPath(root, path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Fstatat(pfd, path.Base(rel), st, unix.AT_SYMLINK_NOFOLLOW)
}

func applyReasonForErrno(err error) string {
	switch {
	case errors.Is(err, unix.ELOOP):
		return ReasonSymlinkInPath
	case errors.Is(err, unix.ENOTDIR):
		return ReasonParentNotDir
	case errors.Is(err, unix.EXDEV):
		return ReasonParentTraversal
	default:
		return ReasonIO
	}
}

// tarRemoveAllAt removes name in dirfd, recursively for directories, never
// following symlinks. It reports whether anything was there.
func tarRemoveAllAt(dirfd int, name string) (bool, error) {
	err := unix.Unlinkat(dirfd, name, 0)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case !errors.Is(err, unix.EISDIR):
		return false, fmt.Errorf("unlink %s: %w", name, err)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", name, err)
	}
	if err := tarClearDir(fd); err != nil {
		return false, fmt.Errorf("%s/%w", name, err)
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, fmt.Errorf("rmdir %s: %w", name, err)
	}
	return true, nil
}

// tarClearDir removes the contents of the directory open at fd and closes fd.
func tarClearDir(fd int) error {
	f := os.NewFile(uintptr(fd), "")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read directory: %w", err)
	}
	dirfd := int(f.Fd())
	for _, name := range names {
		if _, err := tarRemoveAllAt(dirfd, name); err != nil {
			return err
		}
	}
	return nil
}

func tarTimespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// tarSetMtime sets name's mtime (leaving atime) without following a symlink.
func tarSetMtime(dirfd int, name string, mtime time.Time) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, tarTimespec(mtime)}
	if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Apply: replay the validated entries into dest.

type tarApplier struct {
	ctx        context.Context
	root       int
	spool      *os.File
	entries    []applyEntry
	report     ApplyReport
	bufA, bufB []byte
}

func newTarApplier(ctx context.Context, root int, spool *os.File, entries []applyEntry) *tarApplier {
	return &tarApplier{
		ctx: ctx, root: root, spool: spool, entries: entries,
		bufA: make([]byte, tarCopyBufSize), bufB: make([]byte, tarCopyBufSize),
	}
}

func (a *tarApplier) fail(name string, err error) error {
	var ae *ApplyError
	if errors.As(err, &ae) {
		return ae
	}
	return newApplyError(PhaseApply, name, applyReasonForErrno(err), err)
}

// run applies deletions first (so an opaque marker takes effect before the
// directory's new entries, wherever it sat in the stream), then directories
// parents first, then files and symlinks in stream order, then directory
// modes and mtimes children first, and finally syncs the filesystem.
func (a *tarApplier) run() error {
	steps := []struct {
		kinds []applyEntryKind
		order func([]int)
		do    func(*applyEntry) error
	}{
		{[]applyEntryKind{aeWhiteout, aeOpaque}, nil, a.applyDeletion},
		{[]applyEntryKind{aeDir}, a.shallowFirst, a.makeDir},
		{[]applyEntryKind{aeFile, aeSymlink}, nil, a.writeLeaf},
		{[]applyEntryKind{aeDir}, a.deepFirst, a.dirMetadata},
	}
	for _, s := range steps {
		idx := a.indicesOf(s.kinds)
		if s.order != nil {
			s.order(idx)
		}
		for _, i := range idx {
			if err := a.ctx.Err(); err != nil {
				return newApplyError(PhaseApply, "", ReasonCanceled, err)
			}
			if err := s.do(&a.entries[i]); err != nil {
				return a.fail(a.entries[i].name, err)
			}
		}
	}
	if err := unix.Syncfs(a.root); err != nil {
		return newApplyError(PhaseApply, "", ReasonIO, fmt.Errorf("syncfs: %w", err))
	}
	return nil
}

func (a *tarApplier) indicesOf(kinds []applyEntryKind) []int {
	var idx []int
	for i := range a.entries {
		if slices.Contains(kinds, a.entries[i].kind) {
			idx = append(idx, i)
		}
	}
	return idx
}

func tarPathDepth(p string) int { return strings.Count(p, "/") }

func (a *tarApplier) shallowFirst(idx []int) {
	slices.SortStableFunc(idx, func(i, j int) int {
		return tarPathDepth(a.entries[i].name) - tarPathDepth(a.entries[j].name)
	})
}

func (a *tarApplier) deepFirst(idx []int) {
	slices.SortStableFunc(idx, func(i, j int) int {
		return tarPathDepth(a.entries[j].name) - tarPathDepth(a.entries[i].name)
	})
}

// openParent opens the parent directory of an entry, creating missing
// directories one component at a time when create is set.
func (a *tarApplier) openParent(rel string, create bool) (int, error) {
	fd, err := tarOpenDirPath(a.root, rel)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return -1, fmt.Errorf("open directory %s: %w", rel, err)
		}
		return fd, nil
	}
	return a.mkdirChain(rel)
}

func (a *tarApplier) mkdirChain(rel string) (int, error) {
	cur, err := tarOpenDirPath(a.root, ".")
	if err != nil {
		return -1, fmt.Errorf("open dest: %w", err)
	}
	for comp := range strings.SplitSeq(rel, "/") {
		next, err := tarOpenDirPath(cur, comp)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(cur, comp, 0o755); err == nil {
				a.report.DirsCreated++
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				next, err = tarOpenDirPath(cur, comp)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("create directory %s (at %s): %w", rel, comp, err)
		}
		cur = next
	}
	return cur, nil
}

func (a *tarApplier) applyDeletion(e *applyEntry) error {
	if e.skip {
		return nil
	}
	if e.kind == aeOpaque {
		return a.applyOpaque(e)
	}
	pfd, err := a.openParent(path.Dir(e.name), false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	removed, err := tarRemoveAllAt(pfd, path.Base(e.name))
	if err != nil {
		return fmt.Errorf("whiteout: %w", err)
	}
	if removed {
		a.report.DeletesApplied++
	}
	return nil
}

func (a *tarApplier) applyOpaque(e *applyEntry) error {
	fd, err := tarOpenBeneath(a.root, e.name, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open opaque directory: %w", err)
	}
	if err := tarClearDir(fd); err != nil {
		return fmt.Errorf("opaque clear: %w", err)
	}
	a.report.OpaqueClears++
	return nil
}

// makeDir creates a directory entry (owner-only until dirMetadata sets its
// final mode), replacing a non-directory in the way.
func (a *tarApplier) makeDir(e *applyEntry) error {
	pfd, err := a.openParent(path.Dir(e.name), true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(e.name)
	var st unix.Stat_t
	err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil
	case err == nil:
		if _, err := tarRemoveAllAt(pfd, base); err != nil {
			return fmt.Errorf("replace with directory: %w", err)
		}
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("stat: %w", err)
	}
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	a.report.DirsCreated++
	return nil
}

func (a *tarApplier) dirMetadata(e *applyEntry) error {
	pfd, err := a.openParent(path.Dir(e.name), false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(e.name)
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	err = unix.Fchmod(fd, e.perm)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("chmod directory: %w", err)
	}
	return tarSetMtime(pfd, base, e.mtime)
}

func (a *tarApplier) writeLeaf(e *applyEntry) error {
	pfd, err := a.openParent(path.Dir(e.name), true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if e.kind == aeSymlink {
		return a.writeSymlink(pfd, e)
	}
	return a.writeFile(pfd, e)
}

func (a *tarApplier) writeSymlink(pfd int, e *applyEntry) error {
	base := path.Base(e.name)
	if _, err := tarRemoveAllAt(pfd, base); err != nil {
		return fmt.Errorf("replace with symlink: %w", err)
	}
	if err := unix.Symlinkat(e.target, pfd, base); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	a.report.SymlinksWritten++
	return tarSetMtime(pfd, base, e.mtime)
}

func (a *tarApplier) writeFile(pfd int, e *applyEntry) error {
	base := path.Base(e.name)
	same, err := a.sameFile(pfd, base, e)
	if err != nil {
		return err
	}
	if same {
		a.report.SkippedUnchanged++
		return nil
	}
	// Remove whatever is there (never truncating through a symlink or an
	// existing hardlink) and create the file exclusively.
	if _, err := tarRemoveAllAt(pfd, base); err != nil {
		return fmt.Errorf("replace file: %w", err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create file: %w", err)
	}
	if err := a.fillFile(fd, e); err != nil {
		return err
	}
	a.report.FilesWritten++
	a.report.BytesWritten += e.size
	return tarSetMtime(pfd, base, e.mtime)
}

// fillFile writes e's contents and mode to fd and closes it.
func (a *tarApplier) fillFile(fd int, e *applyEntry) error {
	f := os.NewFile(uintptr(fd), e.name)
	// Hide os.File's ReadFrom so that the shared buffer is used.
	_, err := io.CopyBuffer(struct{ io.Writer }{f}, io.NewSectionReader(a.spool, e.off, e.size), a.bufA)
	if err == nil {
		err = f.Chmod(os.FileMode(e.perm))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	return nil
}

// sameFile reports whether dest already holds a regular file with e's mode
// and contents.
func (a *tarApplier) sameFile(pfd int, base string, e *applyEntry) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != e.size || st.Mode&0o7777 != e.perm {
		return false, nil
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, nil // unreadable: just rewrite it
	}
	f := os.NewFile(uintptr(fd), e.name)
	defer f.Close()
	return tarSameContents(f, io.NewSectionReader(a.spool, e.off, e.size), a.bufA, a.bufB)
}

func tarSameContents(x, y io.Reader, bx, by []byte) (bool, error) {
	for {
		nx, errx := io.ReadFull(x, bx)
		ny, erry := io.ReadFull(y, by)
		if !bytes.Equal(bx[:nx], by[:ny]) {
			return false, nil
		}
		xDone := errors.Is(errx, io.EOF) || errors.Is(errx, io.ErrUnexpectedEOF)
		yDone := errors.Is(erry, io.EOF) || errors.Is(erry, io.ErrUnexpectedEOF)
		switch {
		case errx != nil && !xDone:
			return false, nil // unreadable dest file: rewrite it
		case erry != nil && !yDone:
			return false, fmt.Errorf("read spool: %w", erry)
		case xDone || yDone:
			return xDone == yDone, nil
		}
	}
}

// CleanEntryName is the name check of every stream entry, for importers
// that write a stream themselves: it refuses a NUL, an absolute name, a ".."
// component and names past maxBytes (or a component past NAME_MAX), with
// one of the Reason* constants, and returns the cleaned relative name.
func CleanEntryName(raw string, maxBytes int) (name, reason string, err error) {
	return cleanTarName(raw, maxBytes)
}
