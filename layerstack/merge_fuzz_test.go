package layerstack

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// fuzzLineAlphabet turns fuzzer bytes into a file of lines from a small
// alphabet, so that random inputs share many lines and produce interesting
// overlapping hunks. Byte values also pick CRLF endings, and an odd final
// byte drops the final newline.
func fuzzLineAlphabet(b []byte) []byte {
	alphabet := []string{"a\n", "b\n", "c\n", "d\n", "e\r\n", "\n", "a\r\n", "f\n"}
	var out []byte
	for _, c := range b {
		out = append(out, alphabet[c%byte(len(alphabet))]...)
	}
	if len(b) > 0 && b[len(b)-1]&1 == 1 {
		out = bytes.TrimSuffix(out, []byte("\n"))
	}
	return out
}

func addMergeSeeds(f *testing.F) {
	seeds := [][3]string{
		{"", "", ""},
		{"a\nb\nc\n", "a\nB\nc\n", "a\nb\nC\n"},
		{"a\nb\nc\n", "a\nB\nc\n", "a\nX\nc\n"},
		{"a\nb\nc\n", "a\nc\n", "a\nb\nx\nc\n"},
		{"a\nb\nc", "a\nb\nc\n", "A\nb\nc"},
		{"a\nb\n", "a\nB", "a\nb\nc\n"},
		{"a\r\nb\r\n", "A\r\nb\r\n", "a\r\nB\r\n"},
		{"", "x\n", "y\n"},
		{"1\n2\n3\n4\n5\n6\n", "1\nB\nC\n4\nE\nF\n", "1\n2\nc\nd\ne\n6\n"},
		{"\x00\x01\x02\x03", "\x00\x04\x02\x03\x07", "\x00\x01\x05\x03"},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]), []byte(s[2]))
	}
}

func FuzzMerge3(f *testing.F) {
	addMergeSeeds(f)
	f.Fuzz(func(t *testing.T, base, head, ours []byte) {
		for _, merge := range mergeFuncs {
			checkMergeProperties(t, merge, base, head, ours)
			checkMergeProperties(t, merge, fuzzLineAlphabet(base), fuzzLineAlphabet(head), fuzzLineAlphabet(ours))
		}
	})
}

func checkMergeProperties(t *testing.T, merge func(b, h, o []byte) MergeResult, base, head, ours []byte) {
	requireClean(t, head, merge(base, base, head), "Merge3(b,b,x)")
	requireClean(t, head, merge(base, head, base), "Merge3(b,x,b)")
	requireClean(t, head, merge(base, head, head), "Merge3(b,x,x)")

	r, swapped := merge(base, head, ours), merge(base, ours, head)
	if len(r.Conflicts) == 0 {
		requireClean(t, r.Merged, swapped, "Merge3(b,o,h) after clean Merge3(b,h,o)")
		requireWholeLines(t, r.Merged, base, head, ours)
		return
	}
	require.Nil(t, r.Merged)
	require.Equal(t, swapConflicts(r.Conflicts), swapped.Conflicts, "conflicts are not symmetric")
	nb, nh, no := len(splitLines(base)), len(splitLines(head)), len(splitLines(ours))
	prevEnd := 0
	for _, c := range r.Conflicts {
		requireRangeIn(t, c.Base, nb)
		requireRangeIn(t, c.Head, nh)
		requireRangeIn(t, c.Ours, no)
		require.GreaterOrEqual(t, c.Base.Start-1, prevEnd, "conflicts out of base order")
		prevEnd = c.Base.Start - 1 + c.Base.Count
	}
}

// requireWholeLines checks that every line of merged is a line of one of
// the inputs, i.e. the merge never fused two lines into one.
func requireWholeLines(t *testing.T, merged []byte, inputs ...[]byte) {
	t.Helper()
	known := make(map[string]bool)
	for _, in := range inputs {
		for _, l := range splitLines(in) {
			known[string(l)] = true
		}
	}
	for i, l := range splitLines(merged) {
		require.True(t, known[string(l)], "merged line %d %q is in no input", i+1, l)
	}
}

func requireClean(t *testing.T, want []byte, r MergeResult, what string) {
	t.Helper()
	require.Empty(t, r.Conflicts, what)
	require.NotNil(t, r.Merged, what)
	require.Equal(t, string(want), string(r.Merged), what)
}

func requireRangeIn(t *testing.T, r LineRange, n int) {
	t.Helper()
	require.True(t, r.Start >= 1 && r.Count >= 0 && r.Start-1+r.Count <= n, "range %+v outside %d lines", r, n)
}

func FuzzDiffLines(f *testing.F) {
	f.Add([]byte(""), []byte(""))
	f.Add([]byte("a\nb\nc\n"), []byte("a\nc\nd\n"))
	f.Add([]byte("a\nb\nc"), []byte("a\nb\nc\n"))
	f.Add([]byte("x\r\ny\n"), []byte("x\ny\r\n"))
	f.Add([]byte("\x00\x01\x00\x02\x03"), []byte("\x01\x00\x03\x03\x00"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		checkDiffProperties(t, a, b)
		checkDiffProperties(t, fuzzLineAlphabet(a), fuzzLineAlphabet(b))
	})
}

func checkDiffProperties(t *testing.T, a, b []byte) {
	al, bl := splitLines(a), splitLines(b)
	require.Equal(t, string(a), string(bytes.Join(al, nil)))
	hs := diffLines(al, bl)
	checkHunks(t, al, bl, hs)
	if len(al)*len(bl) <= 1<<16 {
		require.Equal(t, len(al)+len(bl)-2*lcsLen(al, bl), changedLines(hs), "diff is not minimal")
	}

	origins := lineOrigins(al, bl)
	require.Len(t, origins, len(bl))
	prev, kept := -1, 0
	for j, i := range origins {
		if i < 0 {
			continue
		}
		require.Greater(t, i, prev, "origins not increasing at %d", j)
		require.Equal(t, al[i], bl[j], "line %d mapped to a different line %d", j, i)
		prev = i
		kept++
	}
	inserted := 0
	for _, h := range hs {
		inserted += h.B1 - h.B0
	}
	require.Equal(t, len(bl)-inserted, kept, "kept lines do not match the diff")
}
