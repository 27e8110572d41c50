package bench

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// WriteCSV writes every sample: scenario, case, op, concurrency,
// latency_ms, error.
func (s *Suite) WriteCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	_ = w.Write([]string{"scenario", "case", "op", "concurrency", "latency_ms", "error"})
	for _, x := range s.Rec.All() {
		_ = w.Write([]string{x.Scenario, x.Case, x.Op, fmt.Sprint(x.Concurrency), fmt.Sprintf("%.4f", float64(x.Latency)/float64(time.Millisecond)), fmt.Sprint(x.Err)})
	}
	w.Flush()
	return w.Error()
}

// Report renders the markdown report. base names the CSV and the plots
// (files next to the report).
func (s *Suite) Report(date, base, command string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmark report — %s\n\n", date)
	fmt.Fprintf(&b, "Reproduce: `%s`. Raw samples: [`%s.csv`](%s.csv). ", command, base, base)
	b.WriteString("Every scenario ran in this one process beside its baseline, back to back, so both saw the same machine.\n\n")
	if s.Analysis != "" {
		fmt.Fprintf(&b, "What these numbers mean, the misses, the profiles and what we would change: [`%s`](%s).\n\n", s.Analysis, s.Analysis)
	}
	b.WriteString("| machine | |\n|---|---|\n")
	for _, k := range sortedKeys(s.Machine) {
		fmt.Fprintf(&b, "| %s | %s |\n", k, s.Machine[k])
	}
	if len(s.Targets) > 0 {
		b.WriteString("\n## Targets\n\nThe performance issue's measures as this run found them, each against its baseline in the same run:\n\n")
		b.WriteString(s.TargetsTable())
	}
	b.WriteString("\nLatencies are nearest-rank percentiles in milliseconds over the successful samples; a failed sample " +
		"is counted in its row, never dropped. Ratios divide the baseline's p50 by ours (above 1: we are faster).\n")
	for _, sec := range s.Sections {
		fmt.Fprintf(&b, "\n## (%s) %s\n\n%s\n", sec.Key, sec.Title, sec.Intro)
		for _, t := range sec.Tables {
			b.WriteString("\n")
			if t.Caption != "" {
				fmt.Fprintf(&b, "%s:\n\n", t.Caption)
			}
			b.WriteString("| " + strings.Join(t.Header, " | ") + " |\n")
			b.WriteString("|" + strings.Repeat("---|", len(t.Header)) + "\n")
			for _, r := range t.Rows {
				b.WriteString("| " + strings.Join(r, " | ") + " |\n")
			}
		}
		for _, p := range s.Plots {
			if plotOf(sec.Key, p.File) {
				fmt.Fprintf(&b, "\n![%s](%s-%s)\n", p.Title, base, p.File)
			}
		}
		if len(sec.Notes) > 0 {
			b.WriteString("\n")
			for _, n := range sec.Notes {
				b.WriteString("- " + n + "\n")
			}
		}
	}
	if len(s.Profiles) > 0 {
		b.WriteString("\n## CPU profiles\n\n")
		for _, p := range s.Profiles {
			b.WriteString("- " + p + "\n")
		}
	}
	return b.String()
}

func plotOf(key, file string) bool {
	switch key {
	case "d":
		return strings.HasPrefix(file, "publish-")
	case "e":
		return strings.HasPrefix(file, "agents-")
	case "g":
		return strings.HasPrefix(file, "sessions-")
	case "h":
		return strings.HasPrefix(file, "depth")
	case "i":
		return strings.HasPrefix(file, "reposize")
	}
	return false
}

// Write writes the report, the CSV and the plots into dir, named by date.
// A hand-written <date>-analysis.md next to it (what the numbers mean,
// misses, what to change) is linked from the report's head.
func (s *Suite) Write(dir, date, command string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := date
	if _, err := os.Stat(filepath.Join(dir, base+"-analysis.md")); err == nil {
		s.Analysis = base + "-analysis.md"
	}
	if err := s.WriteCSV(filepath.Join(dir, base+".csv")); err != nil {
		return "", err
	}
	for _, p := range s.Plots {
		if err := p.Save(filepath.Join(dir, base+"-"+p.File)); err != nil {
			return "", fmt.Errorf("plot %s: %w", p.File, err)
		}
	}
	path := filepath.Join(dir, base+".md")
	return path, os.WriteFile(path, []byte(s.Report(date, base, command)), 0o644)
}
