package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlotOnePointOnLogAxes: a run of one level (sandbox-bench -agents 1)
// draws its plot; one value on a log axis used to panic in gonum.
func TestPlotOnePointOnLogAxes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.png")
	p := Plot{Title: "one level", XLabel: "agents", YLabel: "ms", LogX: true, LogY: true,
		Series: []Series{{Name: "read p50", X: []float64{1}, Y: []float64{1.5}}, {Name: "read p95", X: []float64{1}, Y: []float64{1.5}}}}
	require.NoError(t, p.Save(path))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Positive(t, fi.Size())
}
