package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestThroughputRowOfTheReferencesReport: the loops/s, conflicts and failed
// ops of the n-agent row are read from a report the reference code wrote
// (its 2026-12-01 run), not from the latency table's row of the same n.
func TestThroughputRowOfTheReferencesReport(t *testing.T) {
	f, err := os.Open("results/2026-12-01.md")
	require.NoError(t, err)
	defer f.Close()
	r, ok := throughputRow(f, 50)
	require.True(t, ok)
	require.Equal(t, benchRun{loops: 20.3, conflicts: 54, failures: 0}, r)

	_, ok = throughputRow(strings.NewReader("| 50 | 838 / 1449 / 1939 | 15.7 / 106 / 206 | 17.7 / 116 / 193 | 12.9 / 111 / 162 | 87.9 / 281 / 350 | 1289 / 2158 / 2563 |\n"), 50)
	require.False(t, ok, "a latency row is not a throughput row")
	_, ok = throughputRow(strings.NewReader("| 5 | 122 | 20.3 | 377 | 54 | 0 | 97% / 131% | 113.2 MiB / 162.2 MiB | 76 KiB | 1.6 MiB |\n"), 50)
	require.False(t, ok, "another level's row")
}

// TestUnmeasuredTargetIsNeitherMetNorMissed: a target the run could not
// judge says why in the met column.
func TestUnmeasuredTargetIsNeitherMetNorMissed(t *testing.T) {
	s := &Suite{}
	s.target(Target{Measure: "m", Met: true, Unmeasured: "not measured same-run"})
	s.target(Target{Measure: "n", Met: true})
	s.target(Target{Measure: "o"})
	tab := s.TargetsTable()
	require.Contains(t, tab, "| m |  |  |  |  | not measured same-run |")
	require.Contains(t, tab, "| n |  |  |  |  | yes |")
	require.Contains(t, tab, "| o |  |  |  |  | **missed** |")
}

// TestLoopsPairsMedian: the loops/s target is the median of the pairs'
// ratios (not the ratio of one pair), with their spread, and every failure
// of ours counts against it.
func TestLoopsPairsMedian(t *testing.T) {
	pairs := []loopsPair{
		{ref: benchRun{loops: 20, conflicts: 2}, ours: benchRun{loops: 40, conflicts: 3}},             // 2x
		{ref: benchRun{loops: 20}, ours: benchRun{loops: 26, conflicts: 3}},                           // 1.3x
		{ref: benchRun{loops: 10, failures: 1}, ours: benchRun{loops: 16, failures: 1, conflicts: 3}}, // 1.6x
	}
	sum := summarizePairs(pairs)
	require.InDelta(t, 1.6, sum.ratio, 1e-9, "the median ratio, not the ratio of the medians (26/20)")
	require.InDelta(t, 1.3, sum.lo, 1e-9)
	require.InDelta(t, 2.0, sum.hi, 1e-9)
	require.InDelta(t, 26, sum.ours, 1e-9)
	require.InDelta(t, 20, sum.ref, 1e-9)
	require.EqualValues(t, 1, sum.failures)
	require.EqualValues(t, 9, sum.conflicts)
	require.EqualValues(t, 1, sum.refFailures)
	require.EqualValues(t, 2, sum.refConflicts)
	txt := pairsText(pairs)
	require.Contains(t, txt, "pair 1: 40.0 against 20.0 loops/s, 2x")
	require.Contains(t, txt, "pair 3: 16.0 against 10.0 loops/s, 1.6x")
}
