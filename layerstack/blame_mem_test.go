package layerstack

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Blame of a file of millions of lines counts them by streaming: no value
// per line, no copy of the file (it took some 40 bytes a line).
func TestBlameOfAHugeFileIsBounded(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "a\n"})
	l := mustLease(t, s, sess1)
	const lines = 8 << 20
	_, err := publishOn(t, s, l, sess1, writes("nl.txt", strings.Repeat("\n", lines), "small.txt", "1\n2\n3"))
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, err := s.Blame("nl.txt")
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, 1, got[0].Start)
	require.Equal(t, lines, got[0].Count)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "allocated %d bytes to blame %d lines", after.TotalAlloc-before.TotalAlloc, lines)
	small, err := s.Blame("small.txt")
	require.NoError(t, err)
	require.Equal(t, []BlameRange{{Start: 1, Count: 3, Owner: sess1}}, small, "a last line without a newline counts")
}
