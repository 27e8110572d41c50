package atomicfile

import (
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// WriteFile replaces name with data, which then has mode perm (the umask
// does not apply).
func WriteFile(name string, data []byte, perm fs.FileMode) error {
	return write(name, data, replace, renameio.WithStaticPermissions(perm))
}

// WriteFileKeepMode replaces name with data like WriteFile, but an existing
// file keeps its mode; a new one gets perm less the umask (files a user
// owns, such as a client's config).
func WriteFileKeepMode(name string, data []byte, perm fs.FileMode) error {
	return write(name, data, replace, renameio.WithPermissions(perm), renameio.WithExistingPermissions())
}

// Create writes a new file name holding data with mode perm (the umask
// does not apply). If name exists it is left alone and the error matches
// fs.ErrExist.
func Create(name string, data []byte, perm fs.FileMode) error {
	return write(name, data, link, renameio.WithStaticPermissions(perm))
}

func replace(t *renameio.PendingFile, _ string) error { return t.CloseAtomicallyReplace() }

func link(t *renameio.PendingFile, name string) error {
	if err := t.Sync(); err != nil {
		return err
	}
	return os.Link(t.Name(), name)
}

// write puts data in a temp file beside name, fsyncs it, gives it its
// name (place) and fsyncs the directory. The temp file is removed unless
// place renamed it.
func write(name string, data []byte, place func(*renameio.PendingFile, string) error, opts ...renameio.Option) error {
	dir := filepath.Dir(name)
	t, err := renameio.NewPendingFile(name, append([]renameio.Option{renameio.WithTempDir(dir)}, opts...)...)
	if err != nil {
		return err
	}
	defer func() { _ = t.Cleanup() }()
	if _, err := t.Write(data); err != nil {
		return err
	}
	if err := place(t, name); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir fsyncs dir, which makes a rename, link or removal in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
