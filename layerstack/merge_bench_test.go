package layerstack

import (
	"bytes"
	"fmt"
	"testing"
)

// benchSides returns a 10k-line base and two versions with 50 disjoint
// edits each: head edits lines 0, 200, 400, ...; ours edits 100, 300, ...
// Edits alternate between replacing, inserting after and deleting a line.
func benchSides() (base, head, ours [][]byte) {
	base = numbered(10000)
	edit := func(offset int, who string) [][]byte {
		var out [][]byte
		for i, l := range base {
			if i%200 != offset {
				out = append(out, l)
				continue
			}
			switch (i / 200) % 3 {
			case 0:
				out = append(out, fmt.Appendf(nil, "%s replaced line %d\n", who, i))
			case 1:
				out = append(out, l, fmt.Appendf(nil, "%s inserted after %d\n", who, i))
			case 2: // deleted
			}
		}
		return out
	}
	return base, edit(0, "head"), edit(100, "ours")
}

func BenchmarkMerge3_10kLines(b *testing.B) {
	bl, hl, ol := benchSides()
	base, head, ours := bytes.Join(bl, nil), bytes.Join(hl, nil), bytes.Join(ol, nil)
	if r := Merge3(base, head, ours); len(r.Conflicts) > 0 {
		b.Fatalf("unexpected conflicts: %v", r.Conflicts)
	}
	b.SetBytes(int64(len(base)))
	b.ReportAllocs()
	for b.Loop() {
		Merge3(base, head, ours)
	}
}

func BenchmarkDiffLines_10kLines(b *testing.B) {
	base, head, _ := benchSides()
	b.ReportAllocs()
	for b.Loop() {
		diffLines(base, head)
	}
}
