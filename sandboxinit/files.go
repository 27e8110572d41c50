package sandboxinit

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"golang.org/x/sys/unix"
)

// File operation limits (the seed's, seed-contract §0.4).
const (
	MaxReadOutputBytes = 262_144
	DefaultReadLines   = 2000
	MaxReadLines       = 2000
	MaxReadFileBytes   = 256 << 20
	MaxListEntries     = 2000
	MaxSearchMatches   = 2000
	MaxSearchFileBytes = 4 << 20
)

// fileView is where a file operation acts: a session's mounted workspace,
// or (without a session) the published head.
type fileView struct {
	d  *Daemon
	s  *session // nil: the head
	rt *root
}

// view opens where a file operation acts. In a session it holds the
// session's workspace (mountMu, shared) until close: the workspace is not
// replaced under the operation (switchUpper), so a write never lands in an
// upper dir a move then discards, nor in the bare anchor between two
// overlays.
func (d *Daemon) view(sessionID string) (*fileView, error) {
	if sessionID == "" {
		return &fileView{d: d}, nil
	}
	s, err := d.session(sessionID)
	if err != nil {
		return nil, err
	}
	s.mountMu.RLock()
	if !d.live(s) { // closed (published, destroyed) while the operation waited
		s.mountMu.RUnlock()
		return nil, errSessionNotFound(sessionID)
	}
	r, err := openRoot(s.merged())
	if err != nil {
		s.mountMu.RUnlock()
		return nil, err
	}
	s.act.touch()
	return &fileView{d: d, s: s, rt: r}, nil
}

// writeView is view for an operation that writes: a session that is not
// active (a publish of it prepared or verifying, its finalize failed) is
// refused, as its commands are. Its upper dir is what the publish
// captured: the finalize replaces it (keep) or removes it, so a write
// there would be lost without a word.
func (d *Daemon) writeView(sessionID string) (*fileView, error) {
	v, err := d.view(sessionID)
	if err != nil || v.s == nil {
		return v, err
	}
	if st := v.s.seen().state; st != StateActive {
		id := v.s.rec.ID
		v.close()
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": id, "finalization_state": st,
			"recovery_operation": "recover_workspace_session"}, "workspace session %s is %s: its files are not written until that ends", id, st)
	}
	return v, nil
}

func (v *fileView) close() {
	if v.rt != nil {
		v.rt.Close()
		v.s.mountMu.RUnlock()
	}
}

// openFile opens a regular file for reading and says its size and
// permission bits; files over max bytes (max > 0) are refused. The reader
// stops one byte past the size (a file growing under a session's
// processes is read as it was, plus the byte that shows it grew).
func (v *fileView) openFile(p string, max int64) (io.ReadCloser, int64, fs.FileMode, error) {
	var (
		f    *os.File
		size int64
		mode fs.FileMode
	)
	if v.s == nil {
		var e layerstack.Entry
		var err error
		f, e, err = v.d.store.Head().OpenFile(p, max)
		if err != nil {
			if e.Kind == layerstack.KindSymlink {
				return nil, 0, 0, api.Errorf(api.KindInvalidRequest, map[string]any{"path": p, "target": e.Target}, "%s is a symlink to %s", p, e.Target)
			}
			if e.Kind != "" && e.Kind != layerstack.KindFile {
				return nil, 0, 0, api.Errorf(api.KindInvalidRequest, map[string]any{"path": p}, "%s is a %s, not a regular file", p, e.Kind)
			}
			return nil, 0, 0, fileError(p, err)
		}
		size, mode = e.Size, e.Mode
	} else {
		var fi fs.FileInfo
		var err error
		f, fi, err = v.rt.openRegular(p)
		if err != nil {
			return nil, 0, 0, fileError(p, err)
		}
		if max > 0 && fi.Size() > max {
			f.Close()
			return nil, 0, 0, fileError(p, &layerstack.TooLargeError{Path: p, Size: fi.Size(), Max: max})
		}
		size, mode = fi.Size(), fi.Mode().Perm()
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, size+1), f}, size, mode, nil
}

// readAll returns a regular file's bytes and its permission bits.
func (v *fileView) readAll(p string, max int64) ([]byte, fs.FileMode, error) {
	r, size, mode, err := v.openFile(p, max)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	b := make([]byte, size+1)
	n, err := io.ReadFull(r, b)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return b[:n], mode, err
}

func (d *Daemon) fileRead(a api.FileReadArgs) (*api.FileReadResult, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	if a.Offset == 0 {
		a.Offset = 1
	}
	if a.Limit == 0 {
		a.Limit = DefaultReadLines
	}
	if a.Offset < 1 || a.Limit < 1 || a.Limit > MaxReadLines {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "offset must be >= 1 and limit within 1..%d", MaxReadLines)
	}
	v, err := d.view(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer v.close()
	r, _, _, err := v.openFile(p, MaxReadFileBytes)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res, err := readWindow(r, a)
	if err != nil {
		return nil, fileError(a.Path, err)
	}
	return res, nil
}

func (d *Daemon) fileWrite(ctx context.Context, rid string, a api.FileWriteArgs) (map[string]any, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	typ, err := d.putFile(ctx, "file_write:"+rid, rid, a.WorkspaceSessionID, a.Path, p, []byte(a.Content), a.Executable)
	if err != nil {
		return nil, err
	}
	return map[string]any{"type": typ, "path": a.Path, "bytes_written": len(a.Content)}, nil
}

// putFile writes content to workspace path p (display path shown): in a
// session by an atomic replace confined to its workspace, or, without a
// session, as one published layer under txid (the workflow's amend
// update). It says "create" or "update".
func (d *Daemon) putFile(ctx context.Context, txid, rid, sessionID, shown, p string, content []byte, executable *bool) (string, error) {
	mode := fs.FileMode(0o644)
	if executable != nil && *executable {
		mode = 0o755
	}
	v, err := d.writeView(sessionID)
	if err != nil {
		return "", err
	}
	defer v.close()
	var created bool
	if v.s == nil {
		var r *layerstack.AmendResult
		err := d.sessionless(ctx, txid, "operation:"+rid, []string{p}, func(ctx context.Context) (*layerstack.PublishResult, error) {
			var err error
			r, err = d.store.Amend(ctx, layerstack.AmendRequest{TxID: txid, Path: p, Content: content, Mode: mode, Owner: "operation:" + rid})
			return amendPublish(r), err
		})
		if err != nil {
			return "", fileError(shown, amendError(err))
		}
		created = r.Created
	} else if created, err = v.writeFile(p, content, mode); err != nil {
		return "", fileError(shown, err)
	}
	if created {
		return "create", nil
	}
	return "update", nil
}

// writeFile replaces p in a session atomically (temp file and rename in the
// same directory), keeping an existing file's permission bits.
func (v *fileView) writeFile(p string, data []byte, mode fs.FileMode) (bool, error) {
	dir, name, err := v.rt.openParent(p, true)
	if err != nil {
		return false, err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	created := true
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			created, mode = false, fs.FileMode(st.Mode&0o7777)
		case unix.S_IFDIR:
			return false, api.Errorf(api.KindInvalidRequest, map[string]any{"path": p}, "%s is a directory", p)
		case unix.S_IFLNK:
			return false, api.Errorf(api.KindInvalidRequest, map[string]any{"path": p}, "%s is a symlink; write its target instead", p)
		default:
			return false, api.Errorf(api.KindInvalidRequest, map[string]any{"path": p}, "%s is not a regular file", p)
		}
	}
	f, tmp, err := atomicfile.CreateTempAt(dfd, "."+name+".eos-write-", mode)
	if err != nil {
		return false, err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return false, err
	}
	return created, nil
}

func (d *Daemon) fileEdit(ctx context.Context, rid string, a api.FileEditArgs) (map[string]any, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	if len(a.Edits) == 0 {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "edits must not be empty")
	}
	v, err := d.writeView(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer v.close()
	var n, written int
	if v.s == nil {
		var r *layerstack.AmendResult
		err := d.sessionless(ctx, "file_edit:"+rid, "operation:"+rid, []string{p}, func(ctx context.Context) (*layerstack.PublishResult, error) {
			var err error
			r, err = d.store.Amend(ctx, layerstack.AmendRequest{TxID: "file_edit:" + rid, Path: p, Edits: storeEdits(a.Edits), Owner: "operation:" + rid})
			return amendPublish(r), err
		})
		if err != nil {
			return nil, fileError(a.Path, amendError(err))
		}
		n, written = r.Replacements, int(r.BytesWritten)
	} else {
		old, mode, err := v.readAll(p, layerstack.MaxEditBytes)
		if err != nil {
			return nil, err
		}
		out, reps, err := layerstack.ApplyEdits(old, storeEdits(a.Edits))
		if err != nil {
			return nil, fileError(a.Path, err)
		}
		if _, err := v.writeFile(p, out, mode); err != nil {
			return nil, fileError(a.Path, err)
		}
		n, written = reps, len(out)
	}
	return map[string]any{"type": "edit", "path": a.Path, "edits_applied": len(a.Edits), "replacements": n, "bytes_written": written}, nil
}

func amendPublish(r *layerstack.AmendResult) *layerstack.PublishResult {
	if r == nil {
		return nil
	}
	return &r.PublishResult
}

// amendError maps store refusals of a sessionless write to the wire.
func amendError(err error) error {
	var pe *layerstack.PathError
	if errors.As(err, &pe) {
		if pe.Reason == layerstack.ReasonProtectedPath {
			// A publish the store refuses, as the seed reports it: the
			// operation failed with its publish_rejection.
			rej := &api.PublishRejection{Path: pe.Path, Reason: pe.Reason, Message: pe.Detail,
				ProtectedDrop: &api.ProtectedDrop{Path: pe.Path, Reason: pe.Reason}}
			return api.Errorf(api.KindOperationFailed, map[string]any{"path": pe.Path, "reason": pe.Reason, "publish_rejection": rej}, "publish rejected: %s", pe.Error())
		}
		return api.Errorf(api.KindInvalidRequest, map[string]any{"path": pe.Path, "reason": pe.Reason}, "%s", pe.Error())
	}
	return err
}

func (d *Daemon) fileList(a api.FileListArgs) (map[string]any, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	if a.Limit <= 0 || a.Limit > MaxListEntries {
		a.Limit = MaxListEntries
	}
	v, err := d.view(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer v.close()
	ents, err := v.list(p)
	if errors.Is(err, errNotDirectory) {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path}, "%s is not a directory", a.Path)
	}
	if err != nil {
		return nil, fileError(a.Path, err)
	}
	truncated := len(ents) > a.Limit
	if truncated {
		ents = ents[:a.Limit]
	}
	shown := a.Path
	if shown == "" {
		shown = "."
	}
	return map[string]any{"path": shown, "entries": ents, "truncated": truncated}, nil
}

// errNotDirectory: file_list of a path that exists and is not a directory
// (not one of its parents: that is ENOTDIR).
var errNotDirectory = errors.New("not a directory")

func (v *fileView) list(p string) ([]api.ListEntry, error) {
	out := []api.ListEntry{}
	if v.s == nil {
		head := v.d.store.Head()
		if e, err := head.Stat(p); err == nil && e.Kind != layerstack.KindDirectory {
			return nil, errNotDirectory
		}
		ents, err := head.ReadDir(p)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			out = append(out, api.ListEntry{Name: e.Name, Kind: e.Kind, Size: e.Size})
		}
		return out, nil
	}
	f, err := v.rt.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOTDIR) {
		// p itself, or one of its parents?
		if pf, perr := v.rt.open(p, unix.O_PATH|unix.O_NOFOLLOW, 0); perr == nil {
			pf.Close()
			return nil, errNotDirectory
		}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	for _, n := range names {
		var st unix.Stat_t
		if unix.Fstatat(int(f.Fd()), n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		e := api.ListEntry{Name: n, Kind: "other", Size: st.Size}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			e.Kind = "file"
		case unix.S_IFDIR:
			e.Kind = "directory"
		case unix.S_IFLNK:
			e.Kind = "symlink"
		}
		out = append(out, e)
	}
	return out, nil
}

func (d *Daemon) fileDelete(ctx context.Context, rid string, a api.FileDeleteArgs) (map[string]any, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	if p == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "refusing to delete the workspace root")
	}
	v, err := d.writeView(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer v.close()
	if v.s == nil {
		e, err := d.store.Head().Stat(p)
		if err != nil {
			return nil, fileError(a.Path, err)
		}
		if e.Kind == layerstack.KindDirectory && !a.Recursive {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path}, "%s is a directory: pass recursive to delete it", a.Path)
		}
		err = d.sessionless(ctx, "file_delete:"+rid, "operation:"+rid, []string{p}, func(ctx context.Context) (*layerstack.PublishResult, error) {
			return d.store.CommitOnHead(ctx, layerstack.PublishRequest{TxID: "file_delete:" + rid, Owner: "operation:" + rid,
				Changes: &layerstack.ChangeSet{Changes: []layerstack.Change{{Path: p, Kind: layerstack.ChangeDelete}}}})
		})
		if err != nil {
			return nil, fileError(a.Path, amendError(err))
		}
		return map[string]any{"path": a.Path, "deleted": true}, nil
	}
	dir, name, err := v.rt.openParent(p, false)
	if err != nil {
		return nil, fileError(a.Path, err)
	}
	defer dir.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, fileError(a.Path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if !a.Recursive {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path}, "%s is a directory: pass recursive to delete it", a.Path)
		}
		// The parent is pinned by its fd; RemoveAll never follows symlinks.
		err = os.RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), name))
	} else {
		err = unix.Unlinkat(int(dir.Fd()), name, 0)
	}
	if err != nil {
		return nil, fileError(a.Path, err)
	}
	return map[string]any{"path": a.Path, "deleted": true}, nil
}

func (d *Daemon) fileMove(ctx context.Context, rid string, a api.FileMoveArgs) (map[string]any, error) {
	from, err := workspacePath(a.From)
	if err != nil {
		return nil, err
	}
	to, err := workspacePath(a.To)
	if err != nil {
		return nil, err
	}
	if from == "" || to == "" || from == to || strings.HasPrefix(to, from+"/") {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "cannot move %q to %q", a.From, a.To)
	}
	v, err := d.writeView(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer v.close()
	if v.s == nil {
		return d.moveOnHead(ctx, rid, a, from, to)
	}
	sd, sname, err := v.rt.openParent(from, false)
	if err != nil {
		return nil, fileError(a.From, err)
	}
	defer sd.Close()
	dd, dname, err := v.rt.openParent(to, true)
	if err != nil {
		return nil, fileError(a.To, err)
	}
	defer dd.Close()
	var sst, dst unix.Stat_t
	if err := unix.Fstatat(int(sd.Fd()), sname, &sst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, fileError(a.From, err)
	}
	if unix.Fstatat(int(dd.Fd()), dname, &dst, unix.AT_SYMLINK_NOFOLLOW) == nil {
		if !a.Overwrite {
			return nil, errMoveExists(a)
		}
		toDir := dst.Mode&unix.S_IFMT == unix.S_IFDIR
		if err := replaceRefusal(a, sst.Mode&unix.S_IFMT == unix.S_IFDIR, toDir, toDir && emptyDirAt(int(dd.Fd()), dname)); err != nil {
			return nil, err
		}
	}
	flags := uint(unix.RENAME_NOREPLACE)
	if a.Overwrite {
		flags = 0
	}
	err = unix.Renameat2(int(sd.Fd()), sname, int(dd.Fd()), dname, flags)
	if errors.Is(err, unix.EXDEV) {
		// A directory from a lower layer (overlay without redirect_dir):
		// copy it up by hand, by descriptors (the session's processes run
		// on and may swap what is being copied), beside the destination
		// under a name of its own, rename that into place (over nothing
		// or, with overwrite, an empty directory, as checked), then delete
		// the original. Until the rename nothing at to changes.
		err = copyIntoPlace(int(sd.Fd()), sname, int(dd.Fd()), dname, flags)
		if err == nil {
			// The parent is pinned by its fd; RemoveAll never follows symlinks.
			err = os.RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", sd.Fd(), sname))
		}
	}
	if err != nil {
		return nil, moveError(a, err)
	}
	return map[string]any{"from": a.From, "to": a.To, "moved": true}, nil
}

// copyIntoPlace copies the tree name in the directory src to a new name
// in the directory dst and renames it to dname there (renameat2 flags).
// Whatever fails, the copy is removed: nothing half-copied stays behind.
func copyIntoPlace(src int, name string, dst int, dname string, flags uint) error {
	if len(dname) > 200 { // the suffix must fit in NAME_MAX
		dname = dname[:200]
	}
	tmp := fmt.Sprintf(".%s.eos-move-%s", dname, rand.Text()[:16])
	err := copyTreeAt(src, name, dst, tmp)
	if err == nil {
		err = unix.Renameat2(dst, tmp, dst, dname, flags)
	}
	if err != nil {
		// The parent is pinned by its fd; RemoveAll never follows symlinks.
		_ = os.RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", dst, tmp))
	}
	return err
}

// emptyDirAt reports whether name in the directory dfd is a directory
// without entries (as the overlay shows it: whiteouts are not entries).
func emptyDirAt(dfd int, name string) bool {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	_, err = f.Readdirnames(1)
	return errors.Is(err, io.EOF)
}

func errMoveExists(a api.FileMoveArgs) error {
	return api.Errorf(api.KindInvalidRequest, map[string]any{"to": a.To}, "%s exists: pass overwrite to replace it", a.To)
}

// replaceRefusal is file_move's rule, rename(2)'s, for a destination that
// exists when overwrite is passed: a directory replaces only an empty
// directory, anything else only a non-directory. nil: the move may
// replace it.
func replaceRefusal(a api.FileMoveArgs, fromDir, toDir, toEmpty bool) error {
	d := map[string]any{"from": a.From, "to": a.To}
	switch {
	case fromDir && !toDir:
		return api.Errorf(api.KindInvalidRequest, d, "%s is not a directory: the directory %s cannot replace it", a.To, a.From)
	case !fromDir && toDir:
		return api.Errorf(api.KindInvalidRequest, d, "%s is a directory: only a directory can replace it", a.To)
	case toDir && !toEmpty:
		return api.Errorf(api.KindInvalidRequest, d, "%s is a directory that is not empty: a directory replaces only an empty one (delete it first)", a.To)
	}
	return nil
}

// moveError maps a failed rename or copy of file_move in a session to the
// wire, naming the path at fault. The destination was checked before, so
// these are races with the session's processes.
func moveError(a api.FileMoveArgs, err error) error {
	switch {
	case errors.Is(err, unix.EEXIST) && !a.Overwrite:
		return errMoveExists(a)
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST): // rename(2) says either for a directory that is not empty
		return replaceRefusal(a, true, true, false)
	case errors.Is(err, unix.EISDIR):
		return replaceRefusal(a, false, true, false)
	case errors.Is(err, unix.ENOTDIR):
		return replaceRefusal(a, true, false, false)
	case errors.Is(err, layerstack.ErrNotRegular):
		return api.Errorf(api.KindInvalidRequest, map[string]any{"from": a.From}, "%s holds a FIFO, socket or device, which cannot be moved", a.From)
	}
	return fileError(a.From, err)
}

// moveOnHead is file_move without a session: one publish that deletes from
// and writes its tree at to. The files' content is read from their layer
// files when the publish captures it, never held in memory; if a squash
// removed such a layer in between, the move is planned again on the new
// head, once.
func (d *Daemon) moveOnHead(ctx context.Context, rid string, a api.FileMoveArgs, from, to string) (map[string]any, error) {
	res, err := d.moveOnHeadOnce(ctx, rid, a, from, to)
	if errors.Is(err, errMoveSourceGone) {
		res, err = d.moveOnHeadOnce(ctx, rid, a, from, to)
	}
	if errors.Is(err, errMoveSourceGone) {
		return nil, api.Errorf(api.KindOperationConflict, map[string]any{"from": a.From}, "%s changed (the layer stack was squashed) while it was moved, twice; send the move again", a.From)
	}
	return res, err
}

// errMoveSourceGone: a layer file a sessionless move read from was removed
// before the publish captured it.
var errMoveSourceGone = errors.New("a moved file's layer was removed")

func (d *Daemon) moveOnHeadOnce(ctx context.Context, rid string, a api.FileMoveArgs, from, to string) (map[string]any, error) {
	head := d.store.Head()
	e, err := head.Stat(from)
	if err != nil {
		return nil, fileError(a.From, err)
	}
	if te, err := head.Stat(to); err == nil {
		if !a.Overwrite {
			return nil, errMoveExists(a)
		}
		toDir, toEmpty := te.Kind == layerstack.KindDirectory, false
		if toDir {
			ents, err := head.ReadDir(to)
			if err != nil {
				return nil, fileError(a.To, err)
			}
			toEmpty = len(ents) == 0
		}
		if err := replaceRefusal(a, e.Kind == layerstack.KindDirectory, toDir, toEmpty); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fileError(a.To, err)
	}
	changes := []layerstack.Change{{Path: from, Kind: layerstack.ChangeDelete}}
	add := func(e layerstack.Entry, dst string) error {
		switch e.Kind {
		case layerstack.KindDirectory:
			changes = append(changes, layerstack.Change{Path: dst, Kind: layerstack.ChangeDir, Mode: e.Mode})
		case layerstack.KindSymlink:
			changes = append(changes, layerstack.Change{Path: dst, Kind: layerstack.ChangeSymlink, Target: e.Target})
		default:
			changes = append(changes, e.CopyTo(dst))
		}
		return nil
	}
	if err := add(e, to); err != nil {
		return nil, fileError(a.From, err)
	}
	if e.Kind == layerstack.KindDirectory {
		changes[1].Kind = layerstack.ChangeOpaque
		err := head.Walk(from, func(c layerstack.Entry) error { return add(c, to+c.Path[len(from):]) })
		if err != nil {
			return nil, fileError(a.From, err)
		}
	}
	err = d.sessionless(ctx, "file_move:"+rid, "operation:"+rid, []string{from, to}, func(ctx context.Context) (*layerstack.PublishResult, error) {
		res, err := d.store.CommitOnHead(ctx, layerstack.PublishRequest{TxID: "file_move:" + rid, Owner: "operation:" + rid,
			Changes: &layerstack.ChangeSet{Changes: changes}})
		if errors.Is(err, fs.ErrNotExist) { // only the sources are read: a layer went
			err = errMoveSourceGone
		}
		return res, err
	})
	if errors.Is(err, errMoveSourceGone) {
		return nil, err
	}
	if err != nil {
		return nil, fileError(a.From, amendError(err))
	}
	return map[string]any{"from": a.From, "to": a.To, "moved": true}, nil
}

func (d *Daemon) fileSearch(ctx context.Context, a api.FileSearchArgs) (map[string]any, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	if a.Glob == "" && a.Query == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "give glob, query, or both")
	}
	if _, err := path.Match(a.Glob, "x"); err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "bad glob: %v", err)
	}
	var re *regexp.Regexp
	if a.Query != "" {
		if re, err = regexp.Compile(a.Query); err != nil {
			return nil, api.Errorf(api.KindInvalidRequest, nil, "bad query regular expression: %v", err)
		}
	}
	if a.Limit <= 0 || a.Limit > MaxSearchMatches {
		a.Limit = 200
	}
	v, err := d.view(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer v.close()
	matches := []api.SearchMatch{}
	truncated := false
	errStop := errors.New("stop")
	visit := func(rel string, isFile bool, size int64) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !isFile || strings.HasPrefix(rel, ".git/") {
			return nil
		}
		if a.Glob != "" {
			target := rel
			if !strings.Contains(a.Glob, "/") {
				target = path.Base(rel)
			}
			if ok, _ := path.Match(a.Glob, target); !ok {
				return nil
			}
		}
		if re == nil {
			matches = append(matches, api.SearchMatch{Path: rel})
		} else if size <= MaxSearchFileBytes {
			b, _, err := v.readAll(rel, MaxSearchFileBytes)
			if err != nil || bytes.IndexByte(b, 0) >= 0 {
				return nil
			}
			for i, line := range strings.Split(string(b), "\n") {
				if re.MatchString(line) {
					if len(line) > 500 {
						line = line[:500]
					}
					matches = append(matches, api.SearchMatch{Path: rel, Line: i + 1, Text: line})
					if len(matches) >= a.Limit {
						break
					}
				}
			}
		}
		if len(matches) >= a.Limit {
			truncated = true
			return errStop
		}
		return nil
	}
	if v.s == nil {
		err = d.store.Head().Walk(p, func(e layerstack.Entry) error { return visit(e.Path, e.Kind == layerstack.KindFile, e.Size) })
	} else {
		// By descriptors beneath the workspace: a symlink (planted, or
		// swapped in mid-walk) is never listed through.
		start, oerr := v.rt.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if errors.Is(oerr, unix.ENOTDIR) {
			oerr = os.ErrNotExist
		}
		if oerr != nil {
			return nil, fileError(a.Path, oerr)
		}
		err = walkAt(start, p, func(rel string, st *unix.Stat_t) error {
			return visit(rel, st.Mode&unix.S_IFMT == unix.S_IFREG, st.Size)
		})
		start.Close()
	}
	if err != nil && !errors.Is(err, errStop) {
		return nil, fileError(a.Path, err)
	}
	return map[string]any{"matches": matches, "truncated": truncated}, nil
}

func (d *Daemon) fileBlame(p string) (map[string]any, error) {
	// Audit records are keyed by path as written: "./a" is "a", but a path
	// that climbs ("a/../a") names no record (the seed's key resolution).
	if slices.Contains(strings.Split(p, "/"), "..") {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"path": p}, "no auditability record for path: %s", p)
	}
	rel, err := workspacePath(p)
	if err != nil {
		return nil, err
	}
	ranges, err := d.store.Blame(rel)
	var na *layerstack.NoAuditError
	if errors.As(err, &na) {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"path": p}, "no auditability record for path: %s", rel)
	}
	if err != nil {
		return nil, fileError(p, err)
	}
	if ranges == nil {
		ranges = []layerstack.BlameRange{}
	}
	return map[string]any{"path": rel, "ranges": ranges}, nil // the record's key: "./a" answers as "a"
}

func storeEdits(es []api.Edit) []layerstack.Edit {
	out := make([]layerstack.Edit, len(es))
	for i, e := range es {
		out[i] = layerstack.Edit(e)
	}
	return out
}
