package layerstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// syncBatch is what one commit must make durable before its commit point:
// the layer's entries, the layers/ entry of its rename, its metadata and the
// next manifest (written beside the layer in staging). They are flushed
// together, so the commit waits for one journal commit instead of one per
// file: the fsyncs run concurrently (the filesystem folds them into one
// flush), or, for a large layer, one syncfs replaces them all.
type syncBatch struct {
	syncfs bool
	files  []*os.File
}

// commitSyncfsAbove: a commit whose layer has more entries than this flushes
// with one syncfs. It is syncfsThreshold; BenchmarkPublishSyncfs lowers it
// to compare the two ways on a small commit.
var commitSyncfsAbove = syncfsThreshold

// add opens name (a file or a directory) for the flush. An open descriptor
// follows its inode through a rename, so a layer's entries may be added
// before it leaves staging.
func (sb *syncBatch) add(name string) error {
	if sb.syncfs {
		return nil
	}
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	sb.files = append(sb.files, f)
	return nil
}

// addFile takes f (open for writing) into the batch; close closes it.
func (sb *syncBatch) addFile(f *os.File) { sb.files = append(sb.files, f) }

// flush makes everything in the batch durable. dir names the filesystem
// for syncfs.
func (sb *syncBatch) flush(dir string) error {
	if sb.syncfs {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Syncfs(fd)
	}
	errs := make([]error, len(sb.files))
	var wg sync.WaitGroup
	for i, f := range sb.files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.Sync(); err != nil {
				errs[i] = fmt.Errorf("fsync %s: %w", f.Name(), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (sb *syncBatch) close() {
	for _, f := range sb.files {
		_ = f.Close()
	}
	sb.files = nil
}

// createUnsynced writes a new file name (it must not exist) holding data
// with mode perm and returns it open, not yet synced: the caller puts it in
// a syncBatch. A failed write removes the file.
func createUnsynced(name string, data []byte, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err != nil {
		f.Close()
		os.Remove(name)
		return nil, err
	}
	return f, nil
}

// createMetaUnsynced writes a new layer's metadata for a syncBatch.
func (s *Store) createMetaUnsynced(m *LayerMeta) (*os.File, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	f, err := createUnsynced(s.metaPath(m.ID), b, 0o644)
	if err != nil {
		return nil, fmt.Errorf("write metadata of %s: %w", m.ID, err)
	}
	s.mu.Lock()
	s.metas[m.ID] = m
	s.mu.Unlock()
	return f, nil
}

// writeTxUnsynced replaces a transaction record without waiting for the
// disk. Only a commit uses it, after its manifest is durable: the record is
// derivable from the committed layer's metadata (the boot sweep rewrites a
// lost or torn one), and a squash makes the records of the layers it folds
// durable before its manifest drops them (syncTxRecords).
func (s *Store) writeTxUnsynced(r *PublishResult) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	name := filepath.Join(s.root, dirTxns, txKey(r.TxID)+".json")
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+"-")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// syncTxRecords makes durable the transaction records of layers that are
// about to leave the manifest (a squash folds them): from then on nothing
// but the record says the transaction committed. A record that is missing
// or unreadable is rewritten from the layer's metadata.
func (s *Store) syncTxRecords(layers []ManifestLayer) error {
	found := false
	for _, l := range layers {
		if l.TxID == "" {
			continue
		}
		found = true
		if _, err := s.readTx(l.TxID); err != nil {
			meta, merr := s.meta(l.ID)
			if merr != nil || meta.Result == nil {
				return fmt.Errorf("transaction record of %s: %v (metadata: %v)", l.ID, err, merr)
			}
			if err := s.writeTx(meta.Result); err != nil {
				return err
			}
			continue
		}
		f, err := os.Open(filepath.Join(s.root, dirTxns, txKey(l.TxID)+".json"))
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	if !found {
		return nil
	}
	return atomicfile.SyncDir(filepath.Join(s.root, dirTxns))
}

// manifestBytes is the manifest's on-disk form.
func manifestBytes(m *Manifest) ([]byte, error) { return json.MarshalIndent(m, "", " ") }
