package sandboxinit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"golang.org/x/sys/unix"
)

// WorkspaceRoot is where sessions see the workspace.
const WorkspaceRoot = "/workspace"

// workspacePath turns a user path (relative, or absolute under /workspace)
// into a clean workspace-relative path, refusing everything else.
func workspacePath(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		switch {
		case p == WorkspaceRoot:
			p = ""
		case strings.HasPrefix(p, WorkspaceRoot+"/"):
			p = p[len(WorkspaceRoot)+1:]
		default:
			return "", api.Errorf(api.KindInvalidRequest, map[string]any{"path": p}, "path %q is outside %s: use a path relative to the workspace or under %s", p, WorkspaceRoot, WorkspaceRoot)
		}
	}
	c, err := layerstack.CleanPath(p)
	if err != nil {
		var pe *layerstack.PathError
		if errors.As(err, &pe) {
			return "", api.Errorf(api.KindInvalidRequest, map[string]any{"path": p, "reason": pe.Reason}, "invalid path: %s", pe.Detail)
		}
		return "", err
	}
	return c, nil
}

// root is an open workspace directory (a session's merged view); every path
// is resolved beneath it by layerstack.Dir: a symlink in any component, a
// ".." above it and a mount crossing are refused, so no path a session
// process plants or swaps can lead out of the workspace or be silently
// re-rooted in it (symlinks are never followed by file ops, as the
// sessionless path refuses them too).
type root struct{ d *layerstack.Dir }

func openRoot(dir string) (*root, error) {
	d, err := layerstack.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return &root{d: d}, nil
}

func (r *root) Close() { r.d.Close() }

// open opens rel beneath the root ("" is the root itself).
func (r *root) open(rel string, flags int, mode uint32) (*os.File, error) {
	return r.d.Open(rel, flags, mode)
}

// openRegular opens rel for reading when it is a regular file (checked on
// the opened inode, which is the one read).
func (r *root) openRegular(rel string) (*os.File, fs.FileInfo, error) {
	return r.d.OpenRegular(rel)
}

// openParent opens the directory holding rel and returns it with rel's
// base name. With create, missing parent directories are made (0755).
func (r *root) openParent(rel string, create bool) (*os.File, string, error) {
	dir, name := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		dir, name = rel[:i], rel[i+1:]
	}
	if name == "" {
		return nil, "", api.Errorf(api.KindInvalidRequest, nil, "path names the workspace root")
	}
	d, err := r.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		return d, name, err
	}
	if err := r.mkdirAll(dir); err != nil {
		return nil, "", err
	}
	d, err = r.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	return d, name, err
}

// mkdirAll creates dir and its parents beneath the root, component by
// component, each step resolved in the root.
func (r *root) mkdirAll(dir string) error {
	parts := strings.Split(dir, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		f, err := r.open(prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			f.Close()
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return err
		}
		parent, err := r.open(strings.Join(parts[:i], "/"), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(int(parent.Fd()), parts[i], 0o755)
		parent.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mkdir", Path: prefix, Err: err}
		}
	}
	return nil
}

// fileError maps filesystem errors to the wire's kinds.
func fileError(p string, err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	d := map[string]any{"path": p}
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ENOENT):
		return api.Errorf(api.KindNotFound, d, "file not found: %s", p)
	case errors.Is(err, unix.ENOTDIR):
		return api.Errorf(api.KindInvalidRequest, d, "a parent of %s is not a directory", p)
	case errors.Is(err, unix.EISDIR):
		return api.Errorf(api.KindInvalidRequest, d, "%s is a directory", p)
	case errors.Is(err, unix.ELOOP), errors.Is(err, layerstack.ErrSymlinkInPath):
		return api.Errorf(api.KindInvalidRequest, mergeMaps(d, map[string]any{"reason": "symlink_in_path"}),
			"%s crosses a symlink: file operations never follow symlinks", p)
	case errors.Is(err, unix.EXDEV):
		return api.Errorf(api.KindInvalidRequest, d, "%s leaves the workspace", p)
	case errors.Is(err, layerstack.ErrNotRegular):
		return api.Errorf(api.KindInvalidRequest, d, "%s is not a regular file", p)
	}
	var tl *layerstack.TooLargeError
	if errors.As(err, &tl) {
		return api.Errorf(api.KindInvalidRequest, map[string]any{"path": p, "size": tl.Size, "limit": tl.Max}, "file is too large: %s has %d bytes (limit %d)", p, tl.Size, tl.Max)
	}
	var et *layerstack.EditTooLargeError
	if errors.As(err, &et) {
		// A budget, as an upload's: the same request always fails again.
		return api.Errorf(api.KindResourceExhausted, map[string]any{"path": p, "edit_index": et.Index, "limit": "max_edit_bytes", "max": et.Max, "size": et.Size},
			"edit %d would leave %s with %d bytes, more than max_edit_bytes (%d); nothing was written", et.Index, p, et.Size, et.Max)
	}
	var ee *layerstack.EditError
	if errors.As(err, &ee) {
		return api.Errorf(api.KindInvalidRequest, map[string]any{"path": p, "edit_index": ee.Index, "reason": ee.Reason}, "%s", ee.Error())
	}
	return userMistake(p, err)
}

// userMistake maps the store's refusals of what a caller asked (a write over
// a directory or a symlink, a write under a file, an edit of a file that is
// not text) to invalid_request, as the seed does; anything else is the
// daemon's own failure.
func userMistake(p string, err error) error {
	var nf *layerstack.NotFileError
	switch {
	case errors.As(err, &nf):
		return api.Errorf(api.KindInvalidRequest, map[string]any{"path": p, "kind": nf.Kind}, "%s", nf.Error())
	case errors.Is(err, layerstack.ErrNotUTF8):
		return api.Errorf(api.KindInvalidRequest, map[string]any{"path": p}, "file is not valid UTF-8: %s", p)
	}
	return err
}
