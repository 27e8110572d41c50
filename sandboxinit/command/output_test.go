package command

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type gotLine struct {
	text string
	st   stream
}

func storeLines(ls *lineStore) []gotLine {
	var got []gotLine
	for off := ls.firstOffset(); off < ls.total(); off++ {
		text, st := ls.line(off)
		got = append(got, gotLine{string(text), st})
	}
	return got
}

func TestOutputSplitsLines(t *testing.T) {
	long := strings.Repeat("a", maxLineBytes)
	// "é" is two bytes: a line of 65535 "a"s and 2 "é"s has a rune that
	// straddles the 64 KiB limit and must move whole to the next line.
	straddle := strings.Repeat("a", maxLineBytes-1) + "éé"
	tests := []struct {
		name    string
		chunks  []string
		flush   bool
		want    []string
		partial string
	}{
		{name: "plain", chunks: []string{"a\nb\n"}, want: []string{"a", "b"}},
		{name: "crlf", chunks: []string{"a\r\nb\r\n"}, want: []string{"a", "b"}},
		{name: "crlf split across chunks", chunks: []string{"a\r", "\nb"}, want: []string{"a"}, partial: "b"},
		{name: "lone cr stays", chunks: []string{"50%\r100%\n"}, want: []string{"50%\r100%"}},
		{name: "line across chunks", chunks: []string{"he", "llo", " world\n"}, want: []string{"hello world"}},
		{name: "empty lines", chunks: []string{"\n\nx\n"}, want: []string{"", "", "x"}},
		{name: "partial becomes final on flush", chunks: []string{"a\nb"}, flush: true, want: []string{"a", "b"}},
		{name: "partial cr dropped on flush", chunks: []string{"a\r"}, flush: true, want: []string{"a"}},
		{name: "exactly 64 KiB is one line", chunks: []string{long + "\n"}, want: []string{long}},
		{name: "long line split", chunks: []string{long + "bc\n"}, want: []string{long, "bc"}},
		{name: "long partial split while arriving", chunks: []string{long[:40000], long[40000:] + "xyz"}, want: []string{long}, partial: "xyz"},
		{name: "split keeps runes whole", chunks: []string{straddle + "\n"}, want: []string{straddle[:maxLineBytes-1], "éé"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := output{lines: lineStore{max: 1 << 30}}
			for _, c := range tt.chunks {
				o.write(streamStdout, []byte(c))
			}
			if tt.flush {
				o.flush()
			}
			var got []string
			for _, l := range storeLines(&o.lines) {
				got = append(got, l.text)
			}
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.partial, string(o.partialText(streamStdout)))
		})
	}
}

func TestOutputKeepsStreamsApart(t *testing.T) {
	o := output{lines: lineStore{max: 1 << 20}}
	o.write(streamStdout, []byte("out1\nou"))
	o.write(streamStderr, []byte("err1\ner"))
	o.write(streamStdout, []byte("t2\n"))
	o.write(streamStderr, []byte("r2\n"))
	require.Equal(t, []gotLine{{"out1", streamStdout}, {"err1", streamStderr}, {"out2", streamStdout}, {"err2", streamStderr}},
		storeLines(&o.lines))
}

func TestLineStoreDropsOldestWithinBudget(t *testing.T) {
	const budget = 1000
	ls := lineStore{max: budget}
	const n = 10000
	for i := range n {
		ls.add([]byte(strconv.Itoa(i)), stream(i%2))
		require.LessOrEqual(t, ls.used(), int64(budget))
		require.LessOrEqual(t, cap(ls.text), 4*budget, "the arena must not grow without bound")
	}
	require.Equal(t, n, ls.total())
	require.Positive(t, ls.firstOffset())
	for off := ls.firstOffset(); off < ls.total(); off++ {
		text, st := ls.line(off)
		require.Equal(t, strconv.Itoa(off), string(text))
		require.Equal(t, stream(off%2), st)
	}
	before := storeLines(&ls)
	ls.shrink()
	require.Equal(t, before, storeLines(&ls))
	require.LessOrEqual(t, cap(ls.text), len(ls.text)+64, "spare capacity is released (up to a size class)")
	require.Zero(t, ls.head)

	// Rune counts include dropped lines: the token count is of the whole output.
	var runes int64
	for i := range n {
		runes += int64(len(strconv.Itoa(i)))
	}
	require.Equal(t, runes, ls.runes)
}

func TestLineStoreKeepsNewestLineOverBudget(t *testing.T) {
	ls := lineStore{max: 10}
	ls.add([]byte("first"), streamStdout)
	ls.add([]byte(strings.Repeat("x", 100)), streamStdout)
	require.Equal(t, 2, ls.total())
	require.Equal(t, 1, ls.firstOffset())
	require.Equal(t, 100, ls.lineLen(1))
}

// A store holds little more than it keeps, whatever its lines: about 1.25 ×
// once it is at its cap, at most 1.5 × (plus the newest line) when the
// lines' lengths change. It used to hold up to about 2.5 ×.
func TestLineStoreHoldsLittleMoreThanItKeeps(t *testing.T) {
	const limit = 1 << 20
	phases := []struct {
		name  string
		line  int
		lines int
	}{
		{"long lines", 10_000, 2000},
		{"short lines", 10, 300_000},
		{"empty lines", 0, 300_000},
		{"longest lines", maxLineBytes, 100},
		{"long lines again", 10_000, 2000},
	}
	ls := lineStore{max: limit}
	for _, ph := range phases {
		line := []byte(strings.Repeat("a", ph.line))
		worst := int64(0)
		for range ph.lines {
			ls.add(line, streamStdout)
			held := int64(cap(ls.text)) + lineCost*int64(cap(ls.ends))
			worst = max(worst, held)
			require.LessOrEqual(t, held, int64(limit+limit/2+2*maxLineBytes), ph.name)
		}
		held := int64(cap(ls.text)) + lineCost*int64(cap(ls.ends))
		t.Logf("%s: holds %d KiB at the end, %d KiB at worst, for %d KiB kept", ph.name, held>>10, worst>>10, ls.used()>>10)
		require.LessOrEqual(t, held, int64(limit+limit/4+maxLineBytes), ph.name)
	}

	// A lower limit releases the room at once.
	ls.limit(limit / 4)
	require.LessOrEqual(t, ls.used(), int64(limit/4))
	require.LessOrEqual(t, ls.held(), int64(limit/4+limit/16+64), "lowered")
	require.Equal(t, "a", string(ls.text[len(ls.text)-1:]))
}
