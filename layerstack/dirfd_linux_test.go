package layerstack

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestDirRefusesEverySymlink: a symlink in any component of the path, even
// one that points back inside the directory, is refused, as are ".." and
// anything that is not a regular file; FIFOs are refused without blocking.
func TestDirRefusesEverySymlink(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	writeTree(t, root, tree{"a/b/c/f.txt": "inside"})
	writeTree(t, outside, tree{"a/b/c/f.txt": "outside"})
	d, err := OpenDir(root)
	require.NoError(t, err)
	defer d.Close()

	f, fi, err := d.OpenRegular("a/b/c/f.txt")
	require.NoError(t, err)
	b, _ := io.ReadAll(f)
	f.Close()
	require.Equal(t, "inside", string(b))
	require.True(t, fi.Mode().IsRegular())

	comps := []string{"a", "a/b", "a/b/c", "a/b/c/f.txt"}
	for _, c := range comps {
		for _, target := range []string{filepath.Join(outside, c), "/" + c, filepath.Base(c) + ".real"} {
			t.Run(c+"->"+target, func(t *testing.T) {
				full := filepath.Join(root, c)
				real := full + ".real"
				require.NoError(t, os.Rename(full, real))
				defer func() {
					require.NoError(t, os.Remove(full))
					require.NoError(t, os.Rename(real, full))
				}()
				require.NoError(t, os.Symlink(target, full))
				_, _, err := d.OpenRegular("a/b/c/f.txt")
				if c == "a/b/c/f.txt" {
					require.ErrorIs(t, err, ErrNotRegular, "the final symlink is opened O_PATH, seen, refused")
				} else {
					require.ErrorIs(t, err, unix.ELOOP)
				}
				require.NotContains(t, err.Error(), root, "errors name the relative path only")
				require.Contains(t, err.Error(), "a/b/c/f.txt")
			})
		}
	}
	_, _, err = d.OpenRegular("a/../../" + filepath.Base(outside) + "/a/b/c/f.txt")
	require.ErrorIs(t, err, unix.EXDEV)
	_, _, err = d.OpenRegular("a/b")
	require.ErrorIs(t, err, ErrNotRegular)
	require.NoError(t, unix.Mkfifo(filepath.Join(root, "pipe"), 0o644))
	done := make(chan error, 1)
	go func() { _, _, err := d.OpenRegular("pipe"); done <- err }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrNotRegular)
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO blocked")
	}
	if os.Geteuid() == 0 {
		require.NoError(t, unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))))
		_, _, err = d.OpenRegular("null")
		require.ErrorIs(t, err, ErrNotRegular)
	}
}

// TestCaptureUnderSwapRaceNeverReadsOutside: while a goroutine keeps
// swapping a directory of the upper dir (and a file in it) for symlinks to
// a secret outside, repeated captures, diffs, dry runs and publishes never
// carry a byte of the secret, and their errors never name where the upper
// dir lives.
func TestCaptureUnderSwapRaceNeverReadsOutside(t *testing.T) {
	const secret = "TOP-SECRET-daemon-token-4f1c"
	s := newTestStore(t, tree{"base.txt": "base\n"})
	upper := filepath.Join(t.TempDir(), "upper-0")
	outside := t.TempDir()
	writeTree(t, upper, tree{"d/f.txt": "public\n", "d/g.txt": "public too\n", "top.txt": "top\n"})
	writeTree(t, outside, tree{"f.txt": secret + "\n", "g.txt": secret + "\n", "extra.txt": secret + "\n"})

	var stop atomic.Bool
	var wg sync.WaitGroup
	var swaps atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		d, real := filepath.Join(upper, "d"), filepath.Join(upper, "d.real")
		f, freal := filepath.Join(upper, "top.txt"), filepath.Join(upper, "top.real")
		for !stop.Load() {
			// The directory becomes a symlink to the secret's directory...
			_ = os.Rename(d, real)
			_ = os.Symlink(outside, d)
			// ...and a file becomes a symlink to the secret file.
			_ = os.Rename(f, freal)
			_ = os.Symlink(filepath.Join(outside, "f.txt"), f)
			_ = os.Remove(d)
			_ = os.Rename(real, d)
			_ = os.Remove(f)
			_ = os.Rename(freal, f)
			swaps.Add(1)
		}
	}()

	ctx := context.Background()
	check := func(what string, err error, out []byte) {
		t.Helper()
		if err != nil {
			require.NotContains(t, err.Error(), upper, "%s error names the upper dir", what)
			require.NotContains(t, err.Error(), outside, "%s error names the secret's dir", what)
			require.NotContains(t, err.Error(), secret)
		}
		require.False(t, bytes.Contains(out, []byte(secret)), "%s leaked the secret: %q", what, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	var rounds, published int
	for rounds = 0; (rounds < 400 || swaps.Load() < 2000) && time.Now().Before(deadline); rounds++ {
		cs, err := Capture(upper)
		check("capture", err, nil)
		if err != nil {
			continue
		}
		for _, c := range cs.Changes {
			check("capture path", nil, []byte(c.Path+c.Target))
			if c.Kind != ChangeWrite {
				continue
			}
			if f, _, err := c.OpenSource(); err == nil {
				b, _ := io.ReadAll(f)
				f.Close()
				check("source "+c.Path, nil, b)
			} else {
				check("source "+c.Path, err, nil)
			}
		}
		lease := mustLease(t, s, "race")
		var buf bytes.Buffer
		_, err = s.Diff(ctx, lease.ID, cs, &buf)
		check("diff", err, buf.Bytes())
		res, err := s.CheckPublish(ctx, PublishRequest{LeaseID: lease.ID, Changes: cs, AllowDrops: true})
		check("check_publish", err, []byte(fmt.Sprint(res)))
		if rounds%8 == 0 {
			_, err := s.Publish(ctx, PublishRequest{TxID: nextTx(), LeaseID: lease.ID, Changes: cs, Owner: "race", AllowDrops: true})
			check("publish", err, nil)
			if err == nil {
				published++
			}
		} else {
			require.NoError(t, s.Release(lease.ID))
		}
		cs.Close()
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d rounds, %d publishes, %d swaps", rounds, published, swaps.Load())
	require.GreaterOrEqual(t, swaps.Load(), int64(1000), "the swap loop must have run")
	require.Positive(t, published, "some publish must have committed")

	// Nothing of the secret in any layer the store holds.
	err := filepath.Walk(s.Root(), func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(secret)) {
			return fmt.Errorf("secret bytes in %s", p)
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, s.Head().Walk("", func(e Entry) error {
		if filepath.Base(e.Path) == "extra.txt" {
			return fmt.Errorf("%s: a name from outside reached the head", e.Path)
		}
		return nil
	}))
}
