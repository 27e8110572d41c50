package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
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

// referenceRun is what the reference's own scenario (e) measured.
type referenceRun struct {
	loops               float64
	conflicts, failures int64
	took                time.Duration
}

// runReference runs the reference's sandbox-bench, scenario (e) at n agents
// with this run's scale, agent time and image, from its own tree (its
// gateway, workers, Temporal and daemon, none of ours), and reads the n
// row of its throughput table.
func (s *Suite) runReference(ctx context.Context, n int) (referenceRun, error) {
	r := s.o.LoopsReference
	out := filepath.Join(s.o.WorkDir, "reference-e")
	if err := os.RemoveAll(out); err != nil {
		return referenceRun{}, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return referenceRun{}, err
	}
	logPath := out + ".log"
	logf, err := os.Create(logPath)
	if err != nil {
		return referenceRun{}, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, r.Bench, "-only", "e", "-agents", strconv.Itoa(n), "-scale", strconv.FormatFloat(s.o.Scale, 'g', -1, 64),
		"-agent-time", s.o.AgentTime.String(), "-image", s.o.Image, "-profile=false", "-out", out, "-workdir", filepath.Join(s.o.WorkDir, "reference"))
	cmd.Dir, cmd.Stdout, cmd.Stderr = r.Tree, logf, logf
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return referenceRun{}, fmt.Errorf("the reference %s's bench: %w (log: %s)", r.Name, err, logPath)
	}
	reports, _ := filepath.Glob(filepath.Join(out, "*.md"))
	for _, p := range reports {
		f, err := os.Open(p)
		if err != nil {
			return referenceRun{}, err
		}
		rr, ok := throughputRow(f, n)
		f.Close()
		if ok {
			rr.took = time.Since(t0)
			return rr, nil
		}
	}
	return referenceRun{}, fmt.Errorf("the reference %s's report in %s has no throughput row for %d agents", r.Name, out, n)
}

// throughputRow finds the n-agent row of a report's throughput table
// (columns: agents, ops/s, loops/s, publishes, conflicts, failed ops, ...).
func throughputRow(r io.Reader, n int) (referenceRun, bool) {
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
			return referenceRun{loops: loops, conflicts: conflicts, failures: failures}, true
		}
	}
	return referenceRun{}, false
}
