package bench

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"
)

// Target is one of the performance issue's measures as a run found it:
// ours and the baseline of the same run, their ratio, the goal, and
// whether the run met it.
type Target struct {
	Measure  string
	Ours     string
	Baseline string
	Ratio    string
	Goal     string
	Met      bool
	// Unmeasured, when set, says why the run cannot judge the target
	// (shown in place of met).
	Unmeasured string
}

// faster records a "we are at least goal× faster" target from two p50s.
func (s *Suite) faster(measure string, ours, base time.Duration, baseName string, goal float64) {
	r := 0.0
	if ours > 0 {
		r = float64(base) / float64(ours)
	}
	s.Targets = append(s.Targets, Target{Measure: measure, Ours: fms(ours) + " ms", Baseline: baseName + " " + fms(base) + " ms",
		Ratio: sig3(r) + "x", Goal: fmt.Sprintf("≥ %gx faster", goal), Met: ours > 0 && r >= goal})
}

// fasterRounds is faster judged by the median of rounds' ratios (the
// pooled p50s shown beside them).
func (s *Suite) fasterRounds(measure string, ours, base time.Duration, baseName string, rounds Rounds, goal float64) {
	if len(rounds) == 0 {
		s.faster(measure, ours, base, baseName, goal)
		return
	}
	s.Targets = append(s.Targets, Target{Measure: measure, Ours: fms(ours) + " ms", Baseline: baseName + " " + fms(base) + " ms",
		Ratio: rounds.String(), Goal: fmt.Sprintf("≥ %gx faster", goal), Met: rounds.Median() >= goal})
}

// benchRounds is how many rounds of ours-then-baseline a headline
// comparison runs.
const benchRounds = 3

// target records any other target.
func (s *Suite) target(t Target) { s.Targets = append(s.Targets, t) }

// TargetsTable renders the targets as markdown.
func (s *Suite) TargetsTable() string {
	var b strings.Builder
	b.WriteString("| measure | ours | baseline, same run | ratio | target | met |\n|---|---|---|---|---|---|\n")
	for _, t := range s.Targets {
		met := "**missed**"
		switch {
		case t.Unmeasured != "":
			met = t.Unmeasured
		case t.Met:
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", t.Measure, t.Ours, t.Baseline, t.Ratio, t.Goal, met)
	}
	return b.String()
}

// Markers of the block of README.md that WriteReadme replaces.
const (
	readmeBegin = "<!-- bench-targets:begin (written by cmd/sandbox-bench -readme; do not edit) -->"
	readmeEnd   = "<!-- bench-targets:end -->"
)

// WriteReadme replaces the marked block of the README at path with this
// run's targets table, naming the report it comes from.
func (s *Suite) WriteReadme(path, report string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(old, []byte(readmeBegin)), bytes.Index(old, []byte(readmeEnd))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q block", path, readmeBegin, readmeEnd)
	}
	var b bytes.Buffer
	b.Write(old[:i+len(readmeBegin)])
	fmt.Fprintf(&b, "\nFrom [`%s`](%s) (%s cores, load %s before and %s after; every ratio is of the same run):\n\n",
		report, report, s.Machine["cores"], s.Machine["load_before"], s.Machine["load_after"])
	b.WriteString(s.TargetsTable())
	b.Write(old[j:])
	return os.WriteFile(path, b.Bytes(), 0o644)
}
