package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

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

// File is one file of WriteFiles: its name, content and mode.
type File struct {
	Name string
	Data []byte
	Perm fs.FileMode
}

// WriteFiles replaces each of files as WriteFile does, with the disk waits
// of all of them side by side: every temp file is written, then all are
// fsynced at once, renamed into place in the order given, and their
// directories fsynced at once. A process that dies leaves each file old or
// new, whole; it left the ones before it renamed new. After a power cut
// too each file is old or new, but which of them are new is not ordered:
// a caller that needs one durable before another calls WriteFile twice.
// On an error nothing was renamed, or the error says which rename failed
// (those before it stand).
func WriteFiles(files ...File) error {
	temps := make([]*renameio.PendingFile, len(files))
	defer func() {
		for _, t := range temps {
			if t != nil {
				_ = t.Cleanup()
			}
		}
	}()
	for i, f := range files {
		t, err := renameio.NewPendingFile(f.Name, renameio.WithTempDir(filepath.Dir(f.Name)), renameio.WithStaticPermissions(f.Perm))
		if err != nil {
			return err
		}
		temps[i] = t
		if _, err := t.Write(f.Data); err != nil {
			return err
		}
	}
	if err := each(len(temps), func(i int) error { return temps[i].Sync() }); err != nil {
		return err
	}
	dirs := []string{}
	for i, t := range temps {
		// Synced above: the second sync CloseAtomicallyReplace makes
		// finds nothing to write.
		if err := t.CloseAtomicallyReplace(); err != nil {
			return err
		}
		temps[i] = nil
		if d := filepath.Dir(files[i].Name); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return each(len(dirs), func(i int) error { return SyncDir(dirs[i]) })
}

// each runs f(0..n-1) side by side and joins their errors.
func each(n int, f func(i int) error) error {
	if n == 1 {
		return f(0)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
