package layerstack

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A stream of data and zero runs of any length, cut into writes of any
// size, reads back byte for byte, and its whole zero blocks hold no disk.
func TestHoleWriterKeepsTheBytesAndLeavesZeroBlocksAsHoles(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 40 {
		var want []byte
		zeros := 0
		for range rng.IntN(12) {
			n := rng.IntN(5 * holeBlock)
			if rng.IntN(2) == 0 {
				want = append(want, make([]byte, n)...)
				zeros += n
				continue
			}
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(1 + rng.IntN(255))
			}
			want = append(want, b...)
		}
		if round%5 == 0 { // a long hole, at the end of some
			want = append(want, make([]byte, 1<<20)...)
			zeros += 1 << 20
		}
		p := filepath.Join(dir, "f")
		_ = os.Remove(p)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		require.NoError(t, err)
		w := newHoleWriter(int(f.Fd()))
		for rest := want; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(3*holeBlock))
			n, err := w.Write(rest[:k])
			require.NoError(t, err)
			require.Equal(t, k, n)
			rest = rest[k:]
		}
		require.Equal(t, int64(len(want)), w.Size())
		require.NoError(t, w.Close())
		require.NoError(t, f.Close())
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "round %d: %d bytes read back, %d written", round, len(got), len(want))
		require.LessOrEqual(t, w.written, int64(len(want)-zeros)+2*holeBlock*12+holeBlock, "round %d", round)
		if round%5 == 0 {
			var st unix.Stat_t
			require.NoError(t, unix.Stat(p, &st))
			require.Less(t, st.Blocks*512, int64(len(want)-(1<<20)+64<<10), "round %d: the trailing MiB of zeros holds disk", round)
		}
	}
}

// A session's sparse file is published as a sparse file: the capture's
// copy and the layer built from it hold the data, not the holes.
func TestPublishKeepsASparseFileSparse(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "a\n"})
	l := mustLease(t, s, sess1)
	upper := filepath.Join(t.TempDir(), "upper")
	writeTree(t, upper, tree{"b.txt": "b\n"})
	writeSparse(t, filepath.Join(upper, "disk.img"))
	cs, err := Capture(upper)
	require.NoError(t, err)
	defer cs.Close()
	r, err := publishOn(t, s, l, sess1, cs)
	require.NoError(t, err)
	require.False(t, r.NoOp)
	m, err := s.Manifest()
	require.NoError(t, err)
	top := m.Layers[0] // newest first
	requireSparse(t, filepath.Join(s.layerDir(top), "disk.img"))
	want, err := os.ReadFile(filepath.Join(upper, "disk.img"))
	require.NoError(t, err)
	got, _, err := s.Head().ReadFile("disk.img", 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got))
	requireHealthy(t, s)
}
