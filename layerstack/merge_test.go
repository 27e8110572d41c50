package layerstack

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// textLines builds a file from lines, each given a "\n".
func textLines(ls ...string) string {
	if len(ls) == 0 {
		return ""
	}
	return strings.Join(ls, "\n") + "\n"
}

func TestSplitLines(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"\n", []string{"\n"}},
		{"a", []string{"a"}},
		{"a\n", []string{"a\n"}},
		{"a\nb", []string{"a\n", "b"}},
		{"a\r\nb\r\n", []string{"a\r\n", "b\r\n"}},
		{"a\r\nb\nc\r", []string{"a\r\n", "b\n", "c\r"}},
		{"\n\n", []string{"\n", "\n"}},
	}
	for _, c := range cases {
		got := splitLines([]byte(c.in))
		var gs []string
		for _, l := range got {
			gs = append(gs, string(l))
		}
		require.Equal(t, c.want, gs, "splitLines(%q)", c.in)
		require.Equal(t, c.in, string(bytes.Join(got, nil)))
	}
	// Appending to a line must not clobber the next one.
	ls := splitLines([]byte("a\nb\n"))
	_ = append(ls[0], 'X')
	require.Equal(t, "b\n", string(ls[1]))
}

// mergeFuncs are the public entry point and the general algorithm without
// its shortcuts, so that tests exercise both.
var mergeFuncs = []func(base, head, ours []byte) MergeResult{Merge3, merge3}

func TestMerge3(t *testing.T) {
	base := textLines("1", "2", "3", "4", "5", "6")
	cases := []struct {
		name       string
		base       string
		head, ours string
		want       string          // merged bytes when clean
		conflicts  []MergeConflict // expected conflicts otherwise
	}{
		{
			name: "no change",
			base: base, head: base, ours: base,
			want: base,
		},
		{
			name: "one-sided head",
			base: base, head: textLines("1", "two", "3", "4", "5", "6"), ours: base,
			want: textLines("1", "two", "3", "4", "5", "6"),
		},
		{
			name: "one-sided ours",
			base: base, head: base, ours: textLines("1", "2", "3", "4", "5"),
			want: textLines("1", "2", "3", "4", "5"),
		},
		{
			name: "disjoint",
			base: base,
			head: textLines("1", "two", "3", "4", "5", "6"),
			ours: textLines("1", "2", "3", "4", "five", "6", "7"),
			want: textLines("1", "two", "3", "4", "five", "6", "7"),
		},
		{
			name: "adjacent replacements",
			base: base,
			head: textLines("1", "2", "three", "4", "5", "6"),
			ours: textLines("1", "2", "3", "four", "5", "6"),
			want: textLines("1", "2", "three", "four", "5", "6"),
		},
		{
			name: "overlapping different",
			base: base,
			head: textLines("1", "B", "C", "4", "5", "6"),
			ours: textLines("1", "2", "c", "d", "5", "6"),
			conflicts: []MergeConflict{{
				Base: LineRange{2, 3}, Head: LineRange{2, 3}, Ours: LineRange{2, 3},
			}},
		},
		{
			name: "overlapping identical",
			base: base,
			head: textLines("1", "B", "C", "4", "5", "six"),
			ours: textLines("1", "B", "C", "4", "five", "6"),
			want: textLines("1", "B", "C", "4", "five", "six"),
		},
		{
			name: "transitively chained overlaps",
			base: base,
			head: textLines("1", "B", "C", "4", "E", "F"),
			ours: textLines("1", "2", "c", "d", "e", "6"),
			conflicts: []MergeConflict{{
				Base: LineRange{2, 5}, Head: LineRange{2, 5}, Ours: LineRange{2, 5},
			}},
		},
		{
			name: "identical deletions",
			base: base,
			head: textLines("1", "2", "5", "6"),
			ours: textLines("1", "2", "5", "6"),
			want: textLines("1", "2", "5", "6"),
		},
		{
			name: "both insert same point different",
			base: base,
			head: textLines("1", "2", "h", "3", "4", "5", "6"),
			ours: textLines("1", "2", "o1", "o2", "3", "4", "5", "6"),
			conflicts: []MergeConflict{{
				Base: LineRange{3, 0}, Head: LineRange{3, 1}, Ours: LineRange{3, 2},
			}},
		},
		{
			name: "both insert same point identical",
			base: base,
			head: textLines("1", "2", "x", "3", "4", "5", "6"),
			ours: textLines("1", "2", "x", "3", "4", "5", "6"),
			want: textLines("1", "2", "x", "3", "4", "5", "6"),
		},
		{
			name: "insert before other's deletion",
			base: base,
			head: textLines("1", "2", "5", "6"),
			ours: textLines("1", "2", "x", "3", "4", "5", "6"),
			want: textLines("1", "2", "x", "5", "6"),
		},
		{
			name: "insert after other's deletion",
			base: base,
			head: textLines("1", "2", "5", "6"),
			ours: textLines("1", "2", "3", "4", "x", "5", "6"),
			want: textLines("1", "2", "x", "5", "6"),
		},
		{
			name: "insert inside other's deletion",
			base: base,
			head: textLines("1", "2", "5", "6"),
			ours: textLines("1", "2", "3", "x", "4", "5", "6"),
			conflicts: []MergeConflict{{
				Base: LineRange{3, 2}, Head: LineRange{3, 0}, Ours: LineRange{3, 3},
			}},
		},
		{
			name: "insert after other's replacement",
			base: base,
			head: textLines("1", "2", "C", "D", "E", "5", "6"),
			ours: textLines("1", "2", "3", "4", "x", "5", "6"),
			want: textLines("1", "2", "C", "D", "E", "x", "5", "6"),
		},
		{
			name: "delete all vs edit",
			base: textLines("a", "b", "c"),
			head: "",
			ours: textLines("a", "B", "c"),
			conflicts: []MergeConflict{{
				Base: LineRange{1, 3}, Head: LineRange{1, 0}, Ours: LineRange{1, 3},
			}},
		},
		{
			name: "delete all vs unchanged",
			base: textLines("a", "b", "c"),
			head: "",
			ours: textLines("a", "b", "c"),
			want: "",
		},
		{
			name: "several conflicts in base order",
			base: base,
			head: textLines("one", "2", "3", "4", "5", "six"),
			ours: textLines("uno", "2", "3", "4", "5", "seis", "siete"),
			conflicts: []MergeConflict{
				{Base: LineRange{1, 1}, Head: LineRange{1, 1}, Ours: LineRange{1, 1}},
				{Base: LineRange{6, 1}, Head: LineRange{6, 1}, Ours: LineRange{6, 2}},
			},
		},
		{
			name: "conflict ranges shift with earlier clean hunks",
			base: base,
			head: textLines("0a", "0b", "1", "2", "3", "4", "5", "X"),
			ours: textLines("1", "3", "4", "5", "Y", "Z"),
			conflicts: []MergeConflict{
				{Base: LineRange{6, 1}, Head: LineRange{8, 1}, Ours: LineRange{5, 2}},
			},
		},
		{
			name: "CRLF preserved",
			base: "a\r\nb\r\nc\r\nd\r\n",
			head: "A\r\nb\r\nc\r\nd\r\n",
			ours: "a\r\nb\r\nc\r\nD\r\n",
			want: "A\r\nb\r\nc\r\nD\r\n",
		},
		{
			name: "mixed endings preserved",
			base: "a\nb\r\nc\nd\r\ne",
			head: "a\nB\r\nc\nd\r\ne",
			ours: "a\nb\r\nc\nd\ne",
			want: "a\nB\r\nc\nd\ne",
		},
		{
			name: "line ending change is a change",
			base: "a\nb\nc\n",
			head: "a\r\nb\nc\n",
			ours: "a\nb\nC\n",
			want: "a\r\nb\nC\n",
		},
		{
			name: "no final newline kept when ours edits last line",
			base: "a\nb\nc",
			head: "A\nb\nc",
			ours: "a\nb\nC",
			want: "A\nb\nC",
		},
		{
			name: "head adds final newline",
			base: "a\nb\nc",
			head: "a\nb\nc\n",
			ours: "A\nb\nc",
			want: "A\nb\nc\n",
		},
		{
			name: "ours drops final newline",
			base: "a\nb\nc\n",
			head: "A\nb\nc\n",
			ours: "a\nb\nc",
			want: "A\nb\nc",
		},
		{
			name: "both append to file without final newline",
			base: "a\nb",
			head: "a\nb\nh\n",
			ours: "a\nb\no\n",
			conflicts: []MergeConflict{{
				Base: LineRange{2, 1}, Head: LineRange{2, 2}, Ours: LineRange{2, 2},
			}},
		},
		{
			name: "append after other side dropped final newline",
			base: "a\nb\n",
			head: "a\nB",
			ours: "a\nb\nc\n",
			conflicts: []MergeConflict{{
				Base: LineRange{2, 1}, Head: LineRange{2, 1}, Ours: LineRange{2, 2},
			}},
		},
		{
			name: "append after other side's last-line edit with newline",
			base: "a\nb\n",
			head: "a\nB\n",
			ours: "a\nb\nc\n",
			want: "a\nB\nc\n",
		},
		{
			name: "empty base both created same",
			base: "",
			head: "x\ny\n",
			ours: "x\ny\n",
			want: "x\ny\n",
		},
		{
			name: "empty base both created different",
			base: "",
			head: "x\ny\n",
			ours: "z",
			conflicts: []MergeConflict{{
				Base: LineRange{1, 0}, Head: LineRange{1, 2}, Ours: LineRange{1, 1},
			}},
		},
		{
			name: "empty base one side created",
			base: "",
			head: "",
			ours: "z\n",
			want: "z\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i, merge := range mergeFuncs {
				for _, swap := range []bool{false, true} {
					head, ours := c.head, c.ours
					want := c.conflicts
					if swap {
						head, ours = ours, head
						want = swapConflicts(want)
					}
					r := merge([]byte(c.base), []byte(head), []byte(ours))
					require.Equal(t, want, r.Conflicts, "merge#%d swap=%v", i, swap)
					if len(want) > 0 {
						require.Nil(t, r.Merged, "merge#%d swap=%v", i, swap)
						continue
					}
					require.NotNil(t, r.Merged, "merge#%d swap=%v", i, swap)
					require.Equal(t, c.want, string(r.Merged), "merge#%d swap=%v", i, swap)
				}
			}
		})
	}
}

func swapConflicts(cs []MergeConflict) []MergeConflict {
	var out []MergeConflict
	for _, c := range cs {
		out = append(out, MergeConflict{Base: c.Base, Head: c.Ours, Ours: c.Head})
	}
	return out
}

// numbered returns an n-line file of distinct lines.
func numbered(n int) [][]byte {
	ls := make([][]byte, n)
	for i := range ls {
		ls[i] = fmt.Appendf(nil, "line %d: the quick brown fox jumps over the lazy dog\n", i)
	}
	return ls
}

func TestMerge3LargeFileEditsAtBothEnds(t *testing.T) {
	base := numbered(10000)
	head := append([][]byte{[]byte("// header\n")}, base...)
	head = append([][]byte(nil), head...)
	head[2] = []byte("edited by head\n")
	ours := append([][]byte(nil), base[:len(base)-1]...)
	ours = append(ours, []byte("edited by ours\n"), []byte("tail\n"))

	r := Merge3(bytes.Join(base, nil), bytes.Join(head, nil), bytes.Join(ours, nil))
	require.Empty(t, r.Conflicts)
	want := append([][]byte(nil), head[:len(head)-1]...)
	want = append(want, []byte("edited by ours\n"), []byte("tail\n"))
	require.Equal(t, string(bytes.Join(want, nil)), string(r.Merged))

	// Now both ends conflict.
	ours2 := append([][]byte(nil), base...)
	ours2[1] = []byte("also edited by ours\n")
	ours2[len(ours2)-1] = []byte("ours end\n")
	head2 := append([][]byte(nil), head...)
	head2[len(head2)-1] = []byte("head end\n")
	r = Merge3(bytes.Join(base, nil), bytes.Join(head2, nil), bytes.Join(ours2, nil))
	require.Equal(t, []MergeConflict{
		{Base: LineRange{2, 1}, Head: LineRange{3, 1}, Ours: LineRange{2, 1}},
		{Base: LineRange{10000, 1}, Head: LineRange{10001, 1}, Ours: LineRange{10000, 1}},
	}, r.Conflicts)
}

func TestIsText(t *testing.T) {
	require.True(t, IsText(nil))
	require.True(t, IsText([]byte("héllo\r\nworld")))
	require.False(t, IsText([]byte("a\x00b")))
	require.False(t, IsText([]byte{0xff, 'a'}))
}

// applyHunks applies diffLines' hunks to a, taking replacement lines from b.
func applyHunks(a, b [][]byte, hs []diffHunk) [][]byte {
	var out [][]byte
	pos := 0
	for _, h := range hs {
		out = append(out, a[pos:h.A0]...)
		out = append(out, b[h.B0:h.B1]...)
		pos = h.A1
	}
	return append(out, a[pos:]...)
}

// checkHunks verifies the structural contract of diffLines' output.
func checkHunks(t testing.TB, a, b [][]byte, hs []diffHunk) {
	t.Helper()
	pa, pb := 0, 0
	for i, h := range hs {
		require.True(t, h.A0 <= h.A1 && h.B0 <= h.B1, "hunk %d %+v", i, h)
		require.True(t, h.A0 < h.A1 || h.B0 < h.B1, "empty hunk %d %+v", i, h)
		require.Equal(t, h.A0-pa, h.B0-pb, "hunk %d %+v: unequal gap", i, h)
		if i > 0 {
			require.Greater(t, h.A0, pa, "hunk %d %+v not separated", i, h)
		}
		for k := 0; k < h.A0-pa; k++ {
			if !bytes.Equal(a[pa+k], b[pb+k]) {
				require.Failf(t, "kept lines differ", "before hunk %d: %q vs %q", i, a[pa+k], b[pb+k])
			}
		}
		pa, pb = h.A1, h.B1
	}
	require.Equal(t, len(a)-pa, len(b)-pb)
	require.Equal(t, bytes.Join(b, nil), bytes.Join(applyHunks(a, b, hs), nil))
}

// lcsLen is the textbook O(NM) LCS length, for checking minimality.
func lcsLen(a, b [][]byte) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			switch {
			case bytes.Equal(a[i], b[j]):
				cur[j+1] = prev[j] + 1
			default:
				cur[j+1] = max(prev[j+1], cur[j])
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func changedLines(hs []diffHunk) int {
	n := 0
	for _, h := range hs {
		n += h.A1 - h.A0 + h.B1 - h.B0
	}
	return n
}

// randomLines draws n lines from an alphabet of k lines.
func randomLines(r *rand.Rand, n, k int) [][]byte {
	ls := make([][]byte, n)
	for i := range ls {
		ls[i] = fmt.Appendf(nil, "%d\n", r.IntN(k))
	}
	return ls
}

func TestDiffLinesMinimal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 500; iter++ {
		a := randomLines(r, r.IntN(60), 1+r.IntN(8))
		b := randomLines(r, r.IntN(60), 1+r.IntN(8))
		hs := diffLines(a, b)
		checkHunks(t, a, b, hs)
		require.Equal(t, len(a)+len(b)-2*lcsLen(a, b), changedLines(hs), "iter %d", iter)
	}
}

func TestDiffLinesCases(t *testing.T) {
	sl := func(s string) [][]byte { return splitLines([]byte(s)) }
	cases := []struct {
		a, b string
		want []diffHunk
	}{
		{"", "", nil},
		{"a\n", "a\n", nil},
		{"", "a\nb\n", []diffHunk{{0, 0, 0, 2}}},
		{"a\nb\n", "", []diffHunk{{0, 2, 0, 0}}},
		{"a\nb\nc\n", "a\nX\nc\n", []diffHunk{{1, 2, 1, 2}}},
		{"a\nb\nc\n", "a\nb\nX\nc\n", []diffHunk{{2, 2, 2, 3}}},
		{"a\nb\nc", "a\nb\nc\n", []diffHunk{{2, 3, 2, 3}}},
		{"a\nb\nc\nd\n", "X\nb\nc\nY\n", []diffHunk{{0, 1, 0, 1}, {3, 4, 3, 4}}},
		{"a\r\nb\n", "a\nb\n", []diffHunk{{0, 1, 0, 1}}},
	}
	for _, c := range cases {
		a, b := sl(c.a), sl(c.b)
		hs := diffLines(a, b)
		require.Equal(t, c.want, hs, "%q -> %q", c.a, c.b)
		checkHunks(t, a, b, hs)
	}
}

// TestDiffLinesHeuristic forces the too-expensive fallback and checks the
// result is still a correct (if not minimal) diff.
func TestDiffLinesHeuristic(t *testing.T) {
	oldBudget, oldMin := diffCostBudget, diffMinCost
	diffCostBudget, diffMinCost = 0, 2
	defer func() { diffCostBudget, diffMinCost = oldBudget, oldMin }()
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 300; iter++ {
		a := randomLines(r, r.IntN(200), 1+r.IntN(4))
		b := randomLines(r, r.IntN(200), 1+r.IntN(4))
		checkHunks(t, a, b, diffLines(a, b))
	}
}

func TestDiffLinesLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large input")
	}
	// 200k lines each, wholly diverged: unique lines are set aside.
	n := 200000
	a, b := make([][]byte, n), make([][]byte, n)
	for i := range a {
		a[i] = fmt.Appendf(nil, "a%d\n", i)
		b[i] = fmt.Appendf(nil, "b%d\n", i)
	}
	hs := diffLines(a, b)
	require.Equal(t, []diffHunk{{0, n, 0, n}}, hs)

	// 200k lines from a two-line alphabet: the worst case for Myers; the
	// search bound keeps it fast, the result must still be correct.
	r := rand.New(rand.NewPCG(5, 6))
	a, b = randomLines(r, n, 2), randomLines(r, n, 2)
	checkHunks(t, a, b, diffLines(a, b))

	// 10k-line file with scattered edits is exact.
	base := numbered(10000)
	edited := append([][]byte(nil), base...)
	for i := 0; i < len(edited); i += 500 {
		edited[i] = []byte("changed\n")
	}
	hs = diffLines(base, edited)
	require.Len(t, hs, 20)
	checkHunks(t, base, edited, hs)
}

func TestLineOrigins(t *testing.T) {
	old := splitLines([]byte("a\nb\nc\nd\n"))
	cur := splitLines([]byte("a\nX\nc\nd\nY\n"))
	require.Equal(t, []int{0, -1, 2, 3, -1}, lineOrigins(old, cur))
	require.Equal(t, []int{}, lineOrigins(old, nil))
	require.Equal(t, []int{-1, -1}, lineOrigins(nil, cur[:2]))
}

func TestUnifiedDiff(t *testing.T) {
	cases := []struct {
		name    string
		a, b    string
		context int
		want    string
	}{
		{name: "equal", a: "a\nb\n", b: "a\nb\n", context: 3, want: ""},
		{
			name:    "two hunks",
			a:       textLines("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"),
			b:       textLines("a", "b", "C", "d", "e", "f", "g", "h", "i", "j", "k", "L", "m", "n"),
			context: 3,
			want: "@@ -1,6 +1,6 @@\n a\n b\n-c\n+C\n d\n e\n f\n" +
				"@@ -9,5 +9,6 @@\n i\n j\n k\n-l\n+L\n m\n+n\n",
		},
		{
			name:    "one context line",
			a:       textLines("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"),
			b:       textLines("a", "b", "C", "d", "e", "f", "g", "h", "i", "j", "k", "L", "m", "n"),
			context: 1,
			want:    "@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n@@ -11,3 +11,4 @@\n k\n-l\n+L\n m\n+n\n",
		},
		{
			name:    "no newline both",
			a:       "x\ny",
			b:       "x\nz",
			context: 3,
			want: "@@ -1,2 +1,2 @@\n x\n-y\n\\ No newline at end of file\n" +
				"+z\n\\ No newline at end of file\n",
		},
		{
			name:    "newline dropped",
			a:       textLines("a", "b", "c", "d", "e", "f", "g", "h"),
			b:       "a\nb\nc\nd\ne\nf\ng\nh",
			context: 3,
			want:    "@@ -5,4 +5,4 @@\n e\n f\n g\n-h\n+h\n\\ No newline at end of file\n",
		},
		{
			name:    "from empty",
			a:       "",
			b:       "one\ntwo\n",
			context: 3,
			want:    "@@ -0,0 +1,2 @@\n+one\n+two\n",
		},
		{
			name:    "to empty",
			a:       "one\ntwo\n",
			b:       "",
			context: 3,
			want:    "@@ -1,2 +0,0 @@\n-one\n-two\n",
		},
		{
			name:    "zero context insertion",
			a:       "a\nb\nc\n",
			b:       "a\nX\nb\nc\n",
			context: 0,
			want:    "@@ -1,0 +2 @@\n+X\n",
		},
		{
			name:    "zero context deletion",
			a:       "a\nX\nb\nc\n",
			b:       "a\nb\nc\n",
			context: 0,
			want:    "@@ -2 +1,0 @@\n-X\n",
		},
		{
			name:    "crlf kept",
			a:       "a\r\nb\r\n",
			b:       "a\r\nB\r\n",
			context: 3,
			want:    "@@ -1,2 +1,2 @@\n a\r\n-b\r\n+B\r\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, UnifiedDiff(&buf, []byte(c.a), []byte(c.b), c.context))
			require.Equal(t, c.want, buf.String())
			if want, ok := gnuUnifiedDiff(t, c.a, c.b, c.context); ok {
				require.Equal(t, want, buf.String(), "differs from diff -U%d", c.context)
			}
		})
	}
}

// gnuUnifiedDiff runs the system's diff -U, when there is one, and returns
// its output without the two file header lines.
func gnuUnifiedDiff(t *testing.T, a, b string, context int) (string, bool) {
	path, err := exec.LookPath("diff")
	if err != nil {
		return "", false
	}
	dir := t.TempDir()
	pa, pb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	require.NoError(t, os.WriteFile(pa, []byte(a), 0o600))
	require.NoError(t, os.WriteFile(pb, []byte(b), 0o600))
	out, _ := exec.Command(path, fmt.Sprintf("-U%d", context), pa, pb).Output()
	s := string(out)
	for range 2 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return s, true
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, os.ErrClosed }

func TestUnifiedDiffWriteError(t *testing.T) {
	require.ErrorIs(t, UnifiedDiff(failWriter{}, []byte("a\n"), []byte("b\n"), 3), os.ErrClosed)
}
