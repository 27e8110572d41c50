package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Reference is the code before issue 17's round two, built in a tree of its
// own (scripts/bench-reference.sh): its loops/s is measured in the same
// run as ours, right before our top level of the parallel-agents scenario.
type Reference struct {
	Name  string // e.g. c73852f
	Tree  string // its checkout, with its daemon built (make daemon)
	Bench string // its sandbox-bench, built from Tree
}

// LoadReference checks a tree built by scripts/bench-reference.sh (its
// name, ref-<sha>, gives the reference's short name) and its binaries.
func LoadReference(tree string) (*Reference, error) {
	tree, err := filepath.Abs(tree)
	if err != nil {
		return nil, err
	}
	r := &Reference{Tree: tree, Bench: filepath.Join(tree, "bin", "sandbox-bench"), Name: filepath.Base(tree)}
	if sha, ok := strings.CutPrefix(r.Name, "ref-"); ok && len(sha) >= 7 {
		r.Name = sha[:7]
	}
	for _, p := range []string{r.Bench, filepath.Join(tree, "bin", "sandbox-daemon")} {
		if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%s is not an executable (build the reference with scripts/bench-reference.sh)", p)
		}
	}
	return r, nil
}

// benchRun is what one side's own scenario (e) measured at n agents.
type benchRun struct {
	loops               float64
	conflicts, failures int64
}

// runBench runs a sandbox-bench (bin, from tree dir) as a process of its
// own: scenario (e) at n agents with this run's scale, agent time and
// image, its own gateway, workers, Temporal and daemon, and reads the n
// row of its throughput table. extra are more flags for it.
func (s *Suite) runBench(ctx context.Context, label, bin, dir string, n int, extra ...string) (benchRun, error) {
	out := filepath.Join(s.o.WorkDir, "pair-"+label)
	if err := os.RemoveAll(out); err != nil {
		return benchRun{}, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return benchRun{}, err
	}
	logPath := out + ".log"
	logf, err := os.Create(logPath)
	if err != nil {
		return benchRun{}, err
	}
	defer logf.Close()
	args := append([]string{"-only", "e", "-agents", strconv.Itoa(n), "-scale", strconv.FormatFloat(s.o.Scale, 'g', -1, 64),
		"-agent-time", s.o.AgentTime.String(), "-image", s.o.Image, "-profile=false", "-out", out, "-workdir", filepath.Join(s.o.WorkDir, "pair-work")}, extra...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	if err := cmd.Run(); err != nil {
		return benchRun{}, fmt.Errorf("%s's bench: %w (log: %s)", label, err, logPath)
	}
	reports, _ := filepath.Glob(filepath.Join(out, "*.md"))
	for _, p := range reports {
		f, err := os.Open(p)
		if err != nil {
			return benchRun{}, err
		}
		rr, ok := throughputRow(f, n)
		f.Close()
		if ok {
			return rr, nil
		}
	}
	return benchRun{}, fmt.Errorf("%s's report in %s has no throughput row for %d agents", label, out, n)
}

// runReference runs the reference's own bench (its tree, its binaries).
func (s *Suite) runReference(ctx context.Context, n int) (benchRun, error) {
	r := s.o.LoopsReference
	return s.runBench(ctx, "reference "+r.Name, r.Bench, r.Tree, n)
}

// runSelf runs this bench again, as a process of its own from the same
// directory, with this run's daemon: the same footing as the reference.
func (s *Suite) runSelf(ctx context.Context, n int) (benchRun, error) {
	self, err := os.Executable()
	if err != nil {
		return benchRun{}, err
	}
	dir, err := os.Getwd()
	if err != nil {
		return benchRun{}, err
	}
	extra := []string{"-no-console"} // the reference's loop has none
	if st := s.o.Stack; st.DaemonBinary != "" {
		extra = append(extra, "-daemon-binary", st.DaemonBinary)
	}
	if st := s.o.Stack; len(st.DaemonArgs) > 0 {
		extra = append(extra, "-daemon-args", strings.Join(st.DaemonArgs, " "))
	}
	if s.o.Stack.NoStandby {
		extra = append(extra, "-no-standby")
	}
	return s.runBench(ctx, "this code", self, dir, n, extra...)
}

// throughputRow finds the n-agent row of a report's throughput table
// (columns: agents, ops/s, loops/s, publishes, conflicts, failed ops, ...).
func throughputRow(r io.Reader, n int) (benchRun, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) < 11 || strings.TrimSpace(cells[1]) != strconv.Itoa(n) {
			continue
		}
		loops, err1 := strconv.ParseFloat(strings.TrimSpace(cells[3]), 64)
		conflicts, err2 := strconv.ParseInt(strings.TrimSpace(cells[5]), 10, 64)
		failures, err3 := strconv.ParseInt(strings.TrimSpace(cells[6]), 10, 64)
		if err1 == nil && err2 == nil && err3 == nil {
			return benchRun{loops: loops, conflicts: conflicts, failures: failures}, true
		}
	}
	return benchRun{}, false
}

// loopsPair is one alternating pair of the loops/s target: the reference's
// run, then ours, each a bench process of its own.
type loopsPair struct{ ref, ours benchRun }

// pairsSummary is the loops/s target over its pairs: the medians, the
// spread of the per-pair ratios, and every failure and conflict.
type pairsSummary struct {
	ours, ref, ratio, lo, hi  float64
	failures, conflicts       int64
	refFailures, refConflicts int64
}

func summarizePairs(pairs []loopsPair) pairsSummary {
	var sum pairsSummary
	var ours, refs, ratios []float64
	for _, p := range pairs {
		o := p.ours.loops
		ours, refs = append(ours, o), append(refs, p.ref.loops)
		if p.ref.loops > 0 {
			ratios = append(ratios, o/p.ref.loops)
		}
		sum.failures += p.ours.failures
		sum.conflicts += p.ours.conflicts
		sum.refFailures += p.ref.failures
		sum.refConflicts += p.ref.conflicts
	}
	sum.ours, sum.ref, sum.ratio = median(ours), median(refs), median(ratios)
	if len(ratios) > 0 {
		sum.lo, sum.hi = slices.Min(ratios), slices.Max(ratios)
	}
	return sum
}

// pairsText lists the pairs for the report's note.
func pairsText(pairs []loopsPair) string {
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteString("; ")
		}
		ratio := "–"
		if p.ref.loops > 0 {
			ratio = sig3(p.ours.loops/p.ref.loops) + "x"
		}
		fmt.Fprintf(&b, "pair %d: %s against %s loops/s, %s (ours %d failed ops, %d conflicts; the reference's %d, %d)",
			i+1, fops(p.ours.loops), fops(p.ref.loops), ratio, p.ours.failures, p.ours.conflicts, p.ref.failures, p.ref.conflicts)
	}
	return b.String()
}
