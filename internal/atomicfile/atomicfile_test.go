package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// entries lists dir's names, so a test sees any temp file left behind.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	names := []string{}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func inode(t *testing.T, name string) uint64 {
	t.Helper()
	fi, err := os.Stat(name)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestWriteFileMode(t *testing.T) {
	old := syscall.Umask(0o077) // the mode is perm whatever the umask
	defer syscall.Umask(old)
	for _, tc := range []struct {
		name     string
		existing fs.FileMode // 0: no file before
		perm     fs.FileMode
	}{
		{"new owner-only", 0, 0o600},
		{"new world-readable", 0, 0o644},
		{"replaces a wider mode", 0o666, 0o600},
		{"replaces a narrower mode", 0o600, 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			name := filepath.Join(dir, "f.json")
			if tc.existing != 0 {
				require.NoError(t, os.WriteFile(name, []byte("old"), 0o600))
				require.NoError(t, os.Chmod(name, tc.existing))
			}
			require.NoError(t, WriteFile(name, []byte("new"), tc.perm))
			fi, err := os.Stat(name)
			require.NoError(t, err)
			require.Equal(t, tc.perm, fi.Mode().Perm())
			b, err := os.ReadFile(name)
			require.NoError(t, err)
			require.Equal(t, "new", string(b))
			require.Equal(t, []string{"f.json"}, entries(t, dir), "no temp file is left")
		})
	}
}

func TestWriteFileKeepMode(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := t.TempDir()
	kept := filepath.Join(dir, "config.toml")
	require.NoError(t, os.WriteFile(kept, []byte("old"), 0o644))
	require.NoError(t, os.Chmod(kept, 0o640))
	require.NoError(t, WriteFileKeepMode(kept, []byte("new"), 0o600))
	fi, err := os.Stat(kept)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o640), fi.Mode().Perm(), "an existing file keeps its mode")

	fresh := filepath.Join(dir, "new.toml")
	require.NoError(t, WriteFileKeepMode(fresh, []byte("new"), 0o600))
	fi, err = os.Stat(fresh)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm(), "a new file gets perm")
}

// TestWriteFileNeverTruncates: the old file is replaced, never written in
// place, so whoever holds it (a reader, or the disk after a crash before
// the rename) sees it whole.
func TestWriteFileNeverTruncates(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "manifest.json")
	require.NoError(t, os.WriteFile(name, []byte("old content"), 0o644))
	// A hard link keeps the old inode reachable: an in-place write
	// (truncate, then write) would show through it.
	held := filepath.Join(dir, "held")
	require.NoError(t, os.Link(name, held))
	before := inode(t, name)

	require.NoError(t, WriteFile(name, []byte("new"), 0o644))
	require.NotEqual(t, before, inode(t, name), "the name points at a new file")
	b, err := os.ReadFile(held)
	require.NoError(t, err)
	require.Equal(t, "old content", string(b), "the old file was written in place")
}

// TestWriteFileFullDisk: a write that fails half way (the file system is
// full) leaves the old file whole and no temp file beside it.
func TestWriteFileFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("this test mounts a small tmpfs: run it as root, as make test does")
	}
	dir := t.TempDir()
	require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"))
	defer func() { require.NoError(t, syscall.Unmount(dir, 0)) }()
	name := filepath.Join(dir, "manifest.json")
	old := bytes.Repeat([]byte("o"), 16<<10)
	require.NoError(t, WriteFile(name, old, 0o644))

	err := WriteFile(name, bytes.Repeat([]byte("n"), 1<<20), 0o644)
	require.ErrorIs(t, err, syscall.ENOSPC)
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	require.Equal(t, old, b, "a failed write changed the file")
	require.Equal(t, []string{"manifest.json"}, entries(t, dir), "the temp file is left")
}

// TestWriteFileConcurrentReaders: a reader polling the file while it is
// rewritten sees one whole version or the other, never an empty or
// partial file.
func TestWriteFileConcurrentReaders(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "lease.json")
	versions := [][]byte{bytes.Repeat([]byte("a"), 256<<10), bytes.Repeat([]byte("b"), 256<<10)}
	require.NoError(t, WriteFile(name, versions[0], 0o644))
	stop := make(chan struct{})
	bad := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := os.ReadFile(name)
			if err != nil || !(bytes.Equal(b, versions[0]) || bytes.Equal(b, versions[1])) {
				select {
				case bad <- fmt.Sprintf("%d bytes starting %q (%v)", len(b), b[:min(len(b), 16)], err):
				default:
				}
				return
			}
		}
	})
	for i := range 200 {
		require.NoError(t, WriteFile(name, versions[i%2], 0o644))
	}
	close(stop)
	wg.Wait()
	select {
	case got := <-bad:
		t.Fatalf("a reader saw a partial file: %s", got)
	default:
	}
}

// TestWriteFileConcurrentWriters: writers of one file each use their own
// temp file, so the file always ends as one writer's data, whole, and no
// temp file is left behind. (With one fixed temp name, writers truncate
// and rename each other's temp file.)
func TestWriteFileConcurrentWriters(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "session.json")
	const writers = 8
	datas := make([][]byte, writers)
	for i := range datas {
		datas[i] = bytes.Repeat([]byte{byte('a' + i)}, 64<<10+i)
	}
	for round := 0; round < 20; round++ {
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for i := range writers {
			wg.Go(func() { errs[i] = WriteFile(name, datas[i], 0o600) })
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "writer %d", i)
		}
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		require.Contains(t, datas, b, "round %d: the file is no writer's whole data (%d bytes)", round, len(b))
		require.Equal(t, []string{"session.json"}, entries(t, dir), "round %d: temp files left", round)
	}
}

// TestWriteFileLeavesOthersTempFiles: a file beside the target that looks
// like a temp file (another writer's, or a crashed run's) is not touched.
func TestWriteFileLeavesOthersTempFiles(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "prepared.json")
	for _, other := range []string{name + ".tmp", filepath.Join(dir, ".prepared.json.tmp")} {
		require.NoError(t, os.WriteFile(other, []byte("another writer's data"), 0o600))
	}
	require.NoError(t, WriteFile(name, []byte("mine"), 0o600))
	for _, other := range []string{name + ".tmp", filepath.Join(dir, ".prepared.json.tmp")} {
		b, err := os.ReadFile(other)
		require.NoError(t, err, "%s was taken", other)
		require.Equal(t, "another writer's data", string(b))
	}
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "gateway.secret")
	require.NoError(t, Create(name, []byte("first\n"), 0o600))
	fi, err := os.Stat(name)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())

	err = Create(name, []byte("second\n"), 0o600)
	require.ErrorIs(t, err, fs.ErrExist)
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	require.Equal(t, "first\n", string(b), "Create replaced an existing file")
	require.Equal(t, []string{"gateway.secret"}, entries(t, dir), "no temp file is left")
}

// TestCreateRace: of concurrent creators exactly one wins, and the file
// holds the winner's data whole.
func TestCreateRace(t *testing.T) {
	for round := 0; round < 20; round++ {
		dir := t.TempDir()
		name := filepath.Join(dir, "token")
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = Create(name, bytes.Repeat([]byte{byte('a' + i)}, 32<<10), 0o600) })
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, won, "two creators won")
				won = i
				continue
			}
			require.True(t, errors.Is(err, fs.ErrExist), "creator %d: %v", i, err)
		}
		require.NotEqual(t, -1, won, "no creator won")
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		require.Equal(t, bytes.Repeat([]byte{byte('a' + won)}, 32<<10), b)
		require.Equal(t, []string{"token"}, entries(t, dir))
	}
}

// TestWriteFiles: files in different directories replaced together, none
// of their temp files left; a file that cannot be written leaves every
// target as it was.
func TestWriteFiles(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	require.NoError(t, WriteFile(filepath.Join(a, "lease.json"), []byte("old"), 0o644))
	require.NoError(t, WriteFiles(
		File{Name: filepath.Join(a, "lease.json"), Data: []byte("lease"), Perm: 0o644},
		File{Name: filepath.Join(b, "session.json"), Data: []byte("session"), Perm: 0o600}))
	for name, want := range map[string]string{filepath.Join(a, "lease.json"): "lease", filepath.Join(b, "session.json"): "session"} {
		got, err := os.ReadFile(name)
		require.NoError(t, err)
		require.Equal(t, want, string(got))
	}
	fi, err := os.Stat(filepath.Join(b, "session.json"))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())
	require.Equal(t, []string{"lease.json"}, entries(t, a))
	require.Equal(t, []string{"session.json"}, entries(t, b))

	err = WriteFiles(
		File{Name: filepath.Join(a, "lease.json"), Data: []byte("newer"), Perm: 0o644},
		File{Name: filepath.Join(b, "missing", "session.json"), Data: []byte("x"), Perm: 0o600})
	require.ErrorIs(t, err, fs.ErrNotExist)
	got, err := os.ReadFile(filepath.Join(a, "lease.json"))
	require.NoError(t, err)
	require.Equal(t, "lease", string(got), "nothing is renamed when one file cannot be written")
	require.Equal(t, []string{"lease.json"}, entries(t, a), "no temp file is left")
}
