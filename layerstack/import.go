package layerstack

import (
	"github.com/ephemeral-sandbox/sandbox/archive"
	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
	"github.com/ephemeral-sandbox/sandbox/internal/spreaddir"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// BaseInfo identifies an imported base layer. Its ID is derived from the
// content (paths, kinds, modes, bytes, link targets), so importing the same
// tree twice yields the same base and sandboxes can share it.
type BaseInfo struct {
	ID       string `json:"base_id"`
	RootHash string `json:"root_hash"`
	Path     string `json:"path"`
	Counts   Counts `json:"counts"`
	Bytes    int64  `json:"bytes"`
}

// ImportOptions tune ImportDir.
type ImportOptions struct {
	// All imports every file of a git work tree, gitignored ones included.
	All bool
	// Link hard-links regular files into the layer instead of copying them
	// when src is on the layer's filesystem (copying where it is not). Only
	// for a source nothing writes to afterwards — the daemon's own copy of
	// the workspace, removed after the import: the layer then shares its
	// files' inodes and costs one metadata operation a file. A retried
	// import links again from the intact source, so it is as safe to
	// repeat as a copy.
	Link bool
}

// ImportReport says what an import took and what it left out.
type ImportReport struct {
	Files    int    `json:"files"`
	Dirs     int    `json:"dirs"`
	Symlinks int    `json:"symlinks"`
	Bytes    int64  `json:"bytes"`
	Skipped  []Drop `json:"skipped,omitempty"`
	// GitAware is true when the source was a git work tree imported as
	// tracked plus untracked-not-ignored files (and its .git directory).
	GitAware bool `json:"git_aware"`
	// Reused is true when an identical base already existed.
	Reused bool `json:"reused"`
	// WriteMS and SyncMS are how long the streamed import took to write
	// the tree and to make it durable (ImportStream only).
	WriteMS int64 `json:"write_ms,omitempty"`
	SyncMS  int64 `json:"sync_ms,omitempty"`
}

// ImportDir copies the host directory src into a new base layer under
// parent (normally <store>/base). Symlinks are copied as links, never
// followed; FIFOs, sockets and devices are skipped and reported.
func ImportDir(ctx context.Context, src, parent string, opts ImportOptions) (BaseInfo, *ImportReport, error) {
	src, err := filepath.Abs(src)
	if err != nil {
		return BaseInfo{}, nil, err
	}
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
		return BaseInfo{}, nil, fmt.Errorf("import %s: not a directory (%v)", src, err)
	}
	tmp, err := importDir(parent)
	if err != nil {
		return BaseInfo{}, nil, err
	}
	defer removeAll(tmp)
	im := &importer{ctx: ctx, src: src, dst: tmp, link: opts.Link, report: &ImportReport{}, dirTimes: map[string]time.Time{}}
	paths, git := gitPaths(src, opts)
	if git {
		im.report.GitAware = true
		err = im.copyList(paths)
	} else {
		err = im.copyTree("")
	}
	if err != nil {
		return BaseInfo{}, nil, fmt.Errorf("import %s: %w", src, err)
	}
	im.restoreDirTimes()
	return finishImport(tmp, parent, im.report)
}

// ImportTar imports a base from a tar (or tar.zst) stream, hardened like the
// export applier: the whole stream is validated before anything is written.
func ImportTar(ctx context.Context, r io.Reader, parent string) (BaseInfo, *ImportReport, error) {
	tmp, err := importDir(parent)
	if err != nil {
		return BaseInfo{}, nil, err
	}
	defer removeAll(tmp)
	ar, err := archive.ApplyTar(ctx, r, tmp, archive.ApplyOptions{Mode: archive.ApplyImport})
	if err != nil {
		return BaseInfo{}, nil, fmt.Errorf("import tar: %w", err)
	}
	rep := &ImportReport{Files: ar.FilesWritten, Symlinks: ar.SymlinksWritten, Dirs: ar.DirsCreated, Bytes: ar.BytesWritten}
	for _, s := range ar.Skipped {
		rep.Skipped = append(rep.Skipped, Drop(s))
	}
	return finishImport(tmp, parent, rep)
}

// importDir makes the directory an import fills before it is named by its
// content hash.
func importDir(parent string) (string, error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(parent, ".import-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		removeAll(tmp)
		return "", err
	}
	// A big tree's subdirectories go to block groups of their own, not all
	// into the groups the store's recent churn filled (spreaddir's doc).
	_, _ = spreaddir.Spread(tmp)
	return tmp, nil
}

func finishImport(tmp, parent string, rep *ImportReport) (BaseInfo, *ImportReport, error) {
	digest, counts, bytes, err := treeDigest(tmp)
	if err != nil {
		return BaseInfo{}, nil, err
	}
	return finishImportDigest(tmp, parent, rep, digest, counts, bytes)
}

// finishImportDigest names the filled import directory by its digest
// (reusing an identical base), after one syncfs.
func finishImportDigest(tmp, parent string, rep *ImportReport, digest string, counts Counts, bytes int64) (BaseInfo, *ImportReport, error) {
	id := "B-" + digest[:16]
	info := BaseInfo{ID: id, RootHash: digest, Path: filepath.Join(parent, id), Counts: counts, Bytes: bytes}
	if _, err := os.Lstat(info.Path); err == nil {
		rep.Reused = true
		return info, rep, writeBaseInfo(parent, info)
	}
	t0 := time.Now()
	if err := syncFS(tmp); err != nil {
		return BaseInfo{}, nil, err
	}
	if err := os.Rename(tmp, info.Path); err != nil {
		return BaseInfo{}, nil, err
	}
	if err := atomicfile.SyncDir(parent); err != nil {
		return BaseInfo{}, nil, err
	}
	err := writeBaseInfo(parent, info)
	if rep.WriteMS > 0 {
		rep.SyncMS = time.Since(t0).Milliseconds()
	}
	return info, rep, err
}

// writeBaseInfo leaves <parent>/<id>.json beside a base, so another store
// that mounts the same (shared, content-addressed) base can Init from it.
func writeBaseInfo(parent string, info BaseInfo) error {
	name := filepath.Join(parent, info.ID+".json")
	if _, err := os.Stat(name); err == nil {
		return nil
	}
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(name, b, 0o644)
}

// ReadBaseInfo reads the sidecar of a base imported under parent.
func ReadBaseInfo(parent, id string) (BaseInfo, error) {
	var info BaseInfo
	if err := readJSON(filepath.Join(parent, id+".json"), &info); err != nil {
		return BaseInfo{}, fmt.Errorf("base %s under %s: %w", id, parent, err)
	}
	if info.ID != id {
		return BaseInfo{}, fmt.Errorf("base %s: sidecar names %s", id, info.ID)
	}
	info.Path = filepath.Join(parent, id)
	return info, nil
}

func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// gitPaths lists what a git-aware import takes: tracked and untracked files
// that are not ignored, plus the .git directory. ok is false when src is
// not a git work tree, opts.All is set, or git is unavailable.
func gitPaths(src string, opts ImportOptions) ([]string, bool) {
	if opts.All {
		return nil, false
	}
	if _, err := os.Lstat(filepath.Join(src, ".git")); err != nil {
		return nil, false
	}
	// The work tree's own config must not run a command here (the daemon
	// is more privileged than a session): no fsmonitor hook.
	cmd := exec.Command("git", "-c", "core.fsmonitor=false", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
	out, err := cmd.Output()
	if err != nil {
		return nil, false
	}
	seen := map[string]bool{}
	var paths []string
	for _, p := range bytes.Split(out, []byte{0}) {
		if len(p) > 0 && !seen[string(p)] {
			seen[string(p)] = true
			paths = append(paths, string(p))
		}
	}
	paths = append(paths, ".git")
	sort.Strings(paths)
	return paths, true
}

type importer struct {
	ctx      context.Context
	src, dst string
	link     bool
	report   *ImportReport
	made     map[string]bool
	dirTimes map[string]time.Time
}

func (im *importer) copyList(paths []string) error {
	im.made = map[string]bool{"": true}
	for _, p := range paths {
		if err := im.ctx.Err(); err != nil {
			return err
		}
		fi, err := os.Lstat(filepath.Join(im.src, p))
		if err != nil {
			continue // listed by the index but deleted in the work tree
		}
		for _, a := range ancestors(p) {
			if im.made[a] {
				continue
			}
			afi, err := os.Lstat(filepath.Join(im.src, a))
			if err != nil || !afi.IsDir() {
				return fmt.Errorf("parent %s of %s is not a directory", a, p)
			}
			if err := im.copyEntry(a, afi); err != nil {
				return err
			}
			im.made[a] = true
		}
		if err := im.copyEntry(p, fi); err != nil {
			return err
		}
		if fi.IsDir() {
			if err := im.copyTree(p); err != nil {
				return err
			}
		}
		im.made[p] = true
	}
	return nil
}

func (im *importer) copyTree(rel string) error {
	ents, err := os.ReadDir(filepath.Join(im.src, rel))
	if err != nil {
		return err
	}
	for _, de := range ents {
		if err := im.ctx.Err(); err != nil {
			return err
		}
		p := joinPath(rel, de.Name())
		fi, err := de.Info()
		if err != nil {
			return err
		}
		if err := im.copyEntry(p, fi); err != nil {
			return err
		}
		if fi.IsDir() {
			if err := im.copyTree(p); err != nil {
				return err
			}
		}
	}
	return nil
}

func (im *importer) copyEntry(p string, fi fs.FileInfo) error {
	srcFull, dstFull := filepath.Join(im.src, p), filepath.Join(im.dst, p)
	if !isValidName(p) {
		im.report.Skipped = append(im.report.Skipped, Drop{Path: p, Reason: DropInvalidPath})
		return nil
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		if err := os.Mkdir(dstFull, 0o700); err != nil && !os.IsExist(err) {
			return err
		}
		if err := os.Chmod(dstFull, m.Perm()); err != nil {
			return err
		}
		im.dirTimes[dstFull] = fi.ModTime()
		im.report.Dirs++
	case m.IsRegular():
		if im.link && linkable(fi) {
			if err := os.Link(srcFull, dstFull); err == nil {
				im.report.Bytes += fi.Size()
				im.report.Files++
				return nil
			}
			im.link = false // another filesystem (a shared base volume): copy
		}
		_, n, err := copyFile(srcFull, dstFull)
		if err != nil {
			return err
		}
		im.report.Bytes += n
		if err := os.Chmod(dstFull, m.Perm()); err != nil {
			return err
		}
		_ = os.Chtimes(dstFull, fi.ModTime(), fi.ModTime())
		im.report.Files++
	case m&fs.ModeSymlink != 0:
		t, err := os.Readlink(srcFull)
		if err != nil {
			return err
		}
		if err := os.Symlink(t, dstFull); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(fi.ModTime().UnixNano())
		_ = unix.Lutimes(dstFull, []unix.Timeval{tv, tv})
		im.report.Symlinks++
	default:
		im.report.Skipped = append(im.report.Skipped, Drop{Path: p, Reason: DropSpecialFile})
	}
	return nil
}

// linkable reports whether a hard link gives the file a copy would: a copy
// has only the permission bits (no setuid, setgid or sticky) and is owned
// by this process.
func linkable(fi fs.FileInfo) bool {
	if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid() && int(st.Gid) == os.Getgid()
}

func (im *importer) restoreDirTimes() {
	for d, t := range im.dirTimes {
		_ = os.Chtimes(d, t, t)
	}
}

// isValidName refuses names a layer cannot hold: the whiteout namespace
// (they would turn into deletions when mounted) and non-UTF-8 names.
func isValidName(p string) bool {
	if _, err := CleanPath(p); err != nil {
		return false
	}
	for _, c := range strings.Split(p, "/") {
		if strings.HasPrefix(c, ".wh.") {
			return false
		}
	}
	return true
}
