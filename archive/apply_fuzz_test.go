package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var taFuzzLimits = ApplyLimits{MaxEntries: 256, MaxBytes: 1 << 20, MaxFileBytes: 1 << 19, MaxPathBytes: 512}

const taFuzzSentinel = "sentinel: must never change"

func taFuzzSeeds(f *testing.F) [][]byte {
	seeds := [][]byte{
		taBuildTar(f, tDir("d/"), tFile("d/a", "a"), tSymlink("d/l", "a"), tHardlink("d/h", "d/a"), tFile("top", "t")),
		taBuildTar(f, tWhiteout("keep/.wh.old"), tWhiteout(".wh.gone"), tFile("o/new", "n"), tWhiteout("o/.wh..wh..opq")),
		taBuildTar(f, tDir("link/"), tFile("link/f", "replaces the dest symlink")),
		taBuildTar(f, tFile("link/x", "through a dest symlink")),
		taBuildTar(f, tFile("up/x", "through a dest symlink to .."), tWhiteout("abs/.wh.sentinel")),
		taBuildTar(f, tSymlink("s", "../"), tFile("s/sentinel", "x")),
		taBuildTar(f, tte{name: "dev", typ: tar.TypeChar, mode: 0o666}, tte{name: "fifo", typ: tar.TypeFifo}),
		taBuildTar(f, tte{name: "./", typ: tar.TypeDir, mode: 0o7777}, tte{name: "suid", typ: tar.TypeReg, mode: 0o6777}),
		taPaxNULName(),
		nil,
	}
	seeds = append(seeds, taZstd(f, seeds[0]))
	for _, hc := range taHostileCases() {
		seeds = append(seeds, hc.data(f))
	}
	return seeds
}

// FuzzApplyTar applies arbitrary bytes in both modes and checks that nothing
// escapes dest and that validation failures leave dest untouched.
func FuzzApplyTar(f *testing.F) {
	for _, s := range taFuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		taFuzzApplyOnce(t, data, ApplyChanges)
		taFuzzApplyOnce(t, data, ApplyImport)
	})
}

// taFuzzTempDir prefers tmpfs: directory setup and teardown on a disk
// filesystem would dominate the cost of each run.
func taFuzzTempDir(t *testing.T) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "layerstack-fuzz-*"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

func taFuzzApplyOnce(t *testing.T, data []byte, mode ApplyMode) {
	parent := taFuzzTempDir(t)
	dest, sibling := filepath.Join(parent, "dest"), filepath.Join(parent, "sibling")
	sentinel := filepath.Join(parent, "sentinel")
	require.NoError(t, os.WriteFile(sentinel, []byte(taFuzzSentinel), 0o644))
	require.NoError(t, os.Mkdir(sibling, 0o755))
	require.NoError(t, os.Mkdir(dest, 0o755))
	if mode == ApplyChanges {
		taWriteTree(t, dest, map[string]string{
			"keep/old": "o", "gone": "g", "o/x": "x",
			"link": "->" + sibling, "up": "->..", "abs": "->" + parent,
		})
	}
	before := taSnapshot(t, dest)

	_, err := ApplyTar(context.Background(), bytes.NewReader(data), dest, ApplyOptions{Mode: mode, Limits: taFuzzLimits})

	require.Equal(t, []string{"dest", "sentinel", "sibling"}, taDirNames(t, parent))
	require.Equal(t, taFuzzSentinel, taReadFile(t, sentinel))
	require.Empty(t, taDirNames(t, sibling))
	if err != nil {
		var ae *ApplyError
		require.True(t, errors.As(err, &ae), "error is not an *ApplyError: %v", err)
		if ae.Phase == PhaseValidate {
			require.Equal(t, before, taSnapshot(t, dest), "validation failure touched dest: %v", err)
		}
	}
	taRequireNoSpecialModes(t, dest)
}

// taRequireNoSpecialModes checks that dest holds only plain files, dirs and
// symlinks, without setuid, setgid or sticky bits.
func taRequireNoSpecialModes(t *testing.T, dest string) {
	err := filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		m := info.Mode()
		rel := strings.TrimPrefix(p, dest)
		require.Zero(t, m&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), "%s: %v", rel, m)
		require.True(t, m.IsRegular() || m.IsDir() || m&fs.ModeSymlink != 0, "%s: %v", rel, m)
		return nil
	})
	require.NoError(t, err)
}
