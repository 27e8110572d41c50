package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSummarizeNearestRank(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	s := Summarize(lat, 2, 10*time.Second)
	require.Equal(t, 100, s.N)
	require.Equal(t, 2, s.Errors)
	require.Equal(t, 50*time.Millisecond, s.P50)
	require.Equal(t, 95*time.Millisecond, s.P95)
	require.Equal(t, 99*time.Millisecond, s.P99)
	require.Equal(t, 100*time.Millisecond, s.Max)
	require.InDelta(t, 10.0, s.OpsPerSec, 1e-9)
	require.Equal(t, Summary{Errors: 1}, Summarize(nil, 1, time.Second), "no samples, no made-up numbers")
}

func TestLoadRecordsEveryOperationOnce(t *testing.T) {
	rec := &Recorder{}
	seen := make(chan int, 100)
	Load(rec, "x", "ours", "op", 4, 50, func(w, i int) error {
		if i >= 0 {
			seen <- i
		}
		if i == 7 {
			return os.ErrNotExist
		}
		return nil
	})
	close(seen)
	got := map[int]bool{}
	for i := range seen {
		require.False(t, got[i], "operation %d ran twice", i)
		got[i] = true
	}
	require.Len(t, got, 50)
	lat, errs := rec.Select("x", "ours", "op", 4)
	require.Len(t, lat, 49)
	require.Equal(t, 1, errs, "a failure is counted, not dropped")
}

func TestWriteReport(t *testing.T) {
	s := &Suite{Rec: &Recorder{}, Machine: map[string]string{"cores": "2"}}
	s.Rec.Add(Sample{Scenario: "d", Case: "ours", Op: "1 x 4 KiB", Concurrency: 1, Latency: 20 * time.Millisecond})
	s.Sections = []Section{{Key: "d", Title: "Publish", Intro: "intro", Tables: []Table{{Header: []string{"a", "b"}, Rows: [][]string{{"1", "2"}}}}}}
	s.Plots = []Plot{{File: "publish-files.png", Title: "t", XLabel: "x", YLabel: "y", LogX: true, LogY: true,
		Series: []Series{{Name: "ours p50", X: []float64{1, 10, 100}, Y: []float64{20, 30, 170}}, {Name: "ours p95", X: []float64{1, 10}, Y: []float64{25, 0}}}}}
	dir := t.TempDir()
	path, err := s.Write(dir, "2026-12-01", "make bench")
	require.NoError(t, err)
	md, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(md), "## (d) Publish")
	require.Contains(t, string(md), "| a | b |\n|---|---|\n| 1 | 2 |")
	require.Contains(t, string(md), "![t](2026-12-01-publish-files.png)")
	png, err := os.ReadFile(filepath.Join(dir, "2026-12-01-publish-files.png"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(png), "\x89PNG"), "a PNG")
	csv, err := os.ReadFile(filepath.Join(dir, "2026-12-01.csv"))
	require.NoError(t, err)
	require.Equal(t, "scenario,case,op,concurrency,latency_ms,error\nd,ours,1 x 4 KiB,1,20.0000,false\n", string(csv))
}

// The run's targets lead the report and replace README.md's marked block,
// and only it.
func TestTargetsReachReportAndReadme(t *testing.T) {
	s := &Suite{Rec: &Recorder{}, Machine: map[string]string{"cores": "2", "load_before": "0.5", "load_after": "0.7"}}
	s.faster("exec", 2*time.Millisecond, 60*time.Millisecond, "`docker exec`", 25)
	s.faster("publish", 20*time.Millisecond, 30*time.Millisecond, "git", 3)
	s.target(Target{Measure: "memory", Ours: "900 KiB", Baseline: "–", Ratio: "–", Goal: "≤ 1 MiB", Met: true})
	require.Equal(t, "| measure | ours | baseline, same run | ratio | target | met |\n|---|---|---|---|---|---|\n"+
		"| exec | 2 ms | `docker exec` 60 ms | 30x | ≥ 25x faster | yes |\n"+
		"| publish | 20 ms | git 30 ms | 1.5x | ≥ 3x faster | **missed** |\n"+
		"| memory | 900 KiB | – | – | ≤ 1 MiB | yes |\n", s.TargetsTable())
	dir := t.TempDir()
	path, err := s.Write(dir, "2026-12-01", "make bench")
	require.NoError(t, err)
	md, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(md), "## Targets\n")

	readme := filepath.Join(dir, "README.md")
	require.NoError(t, os.WriteFile(readme, []byte("# x\n\nbefore\n"+readmeBegin+"\nold table\n"+readmeEnd+"\nafter\n"), 0o644))
	require.NoError(t, s.WriteReadme(readme, "bench/results/2026-12-01.md"))
	got, err := os.ReadFile(readme)
	require.NoError(t, err)
	require.NotContains(t, string(got), "old table")
	require.True(t, strings.HasPrefix(string(got), "# x\n\nbefore\n"+readmeBegin+"\nFrom [`bench/results/2026-12-01.md`]"), string(got))
	require.True(t, strings.HasSuffix(string(got), "| memory | 900 KiB | – | – | ≤ 1 MiB | yes |\n"+readmeEnd+"\nafter\n"), string(got))
	require.Error(t, s.WriteReadme(filepath.Join(dir, "2026-12-01.md"), "x"), "a file without the block is refused")
}

func TestSig2NeverPrintsAnExponent(t *testing.T) {
	for r, want := range map[float64]string{0.374: "0.37", 1.52: "1.5", 21.4: "21", 99.4: "99", 103.2: "103", 1234.5: "1235"} {
		require.Equal(t, want, sig2(r), "%v", r)
	}
}
