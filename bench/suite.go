package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Options configure a suite run.
type Options struct {
	Image     string  // sandbox and baseline image
	Scale     float64 // multiplies every sample count and duration
	Agents    []int   // concurrency levels of the parallel-agents scenario
	AgentTime time.Duration
	Only      []string // scenario keys to run (a..f, p); empty = all
	WorkDir   string   // repositories, worktrees, scratch
	Stack     StackOptions
	Log       *slog.Logger
	// Profile, when set, is where CPU profiles of the slowest scenarios go
	// (this process: gateway, workers, embedded Temporal; and the daemon).
	Profile string
	// LoopsReference, when set, is run for the loops/s target (reference.go).
	LoopsReference *Reference
	// NoConsole leaves out scenario (e)'s console, which reads the
	// sandbox's record every 250 ms beside the agents.
	NoConsole bool
	// LoopsPairs is how many alternating pairs (the reference's run, then
	// ours) the loops/s target takes its median over (0: DefaultLoopsPairs).
	LoopsPairs int
}

// DefaultLoopsPairs is the loops/s target's pairs unless told.
const DefaultLoopsPairs = 3

func (o Options) loopsPairs() int {
	if o.LoopsPairs > 0 {
		return o.LoopsPairs
	}
	return DefaultLoopsPairs
}

// Suite runs the scenarios and keeps what the report needs.
type Suite struct {
	o        Options
	st       *Stack
	Rec      *Recorder
	Sections []Section
	Plots    []Plot
	Profiles []string
	Machine  map[string]string
	Analysis string // the hand-written analysis file next to the report, if any
	// Targets are the performance issue's measures this run took (the
	// report's first table, and README.md's with -readme).
	Targets []Target
}

// Section is one scenario's part of the report.
type Section struct {
	Key, Title, Intro string
	Tables            []Table
	Notes             []string
}

// Table is a markdown table.
type Table struct {
	Caption string
	Header  []string
	Rows    [][]string
}

// Plot is a line chart: one series per name over a shared x axis.
type Plot struct {
	File, Title, XLabel, YLabel string
	LogX, LogY                  bool
	Series                      []Series
}

// Series is one line of a plot.
type Series struct {
	Name string
	X, Y []float64
}

// repoSandbox creates a sandbox over the suite's repository of files 4 KiB
// files (made once per run) and returns it with its removal.
func (s *Suite) repoSandbox(ctx context.Context, name string, files int) (repo, id string, destroy func(), err error) {
	repo = filepath.Join(s.o.WorkDir, name)
	if err := ensureRepo(repo, files, 4096); err != nil {
		return "", "", nil, err
	}
	id, err = s.st.CreateSandbox(ctx, s.o.Image, repo)
	if err != nil {
		return "", "", nil, err
	}
	return repo, id, func() { s.st.DestroySandbox(id) }, nil
}

// summary summarizes the recorded samples of one scenario, case and op.
func (s *Suite) summary(scenario, cas, op string, c int, wall time.Duration) Summary {
	lat, errs := s.Rec.Select(scenario, cas, op, c)
	return Summarize(lat, errs, wall)
}

// n scales a sample count (at least 3).
func (s *Suite) n(base int) int { return max(3, int(math.Round(float64(base)*s.o.Scale))) }

func (s *Suite) want(key string) bool {
	if len(s.o.Only) == 0 {
		return true
	}
	for _, k := range s.o.Only {
		if k == key {
			return true
		}
	}
	return false
}

// scenario is one runnable scenario.
type scenario struct {
	key, title string
	run        func(ctx context.Context, s *Suite) (Section, error)
}

// scenarios run in this order; (f) comes before (e): after the parallel
// agents' churn (four sandboxes, ~1,300 publishes, their volumes removed)
// every Docker operation on this VM ran 3-10x slower for minutes — ours
// and the baseline's alike — which is the host's state, not what a create
// costs.
var scenarios = []scenario{
	{"a", "Command in a session vs docker exec", runCommand},
	{"b", "Session create vs docker run and git worktree add", runSessionCreate},
	{"c", "4 KiB file read and write vs docker exec", runFiles},
	{"d", "Publish latency against change-set size", runPublishSize},
	{"p", "Small publish (one 4 KiB file) vs git add -A && git commit, in rounds", runSmallPublish},
	{"f", "Sandbox create for a 1k-file and a 20k-file repository", runSandboxCreate},
	{"e", "Parallel agents in one sandbox", runAgents},
	{"g", "Sessions per sandbox: create, memory and exec at 10, 50, 200 sessions", runSessions},
	{"h", "Publish and file_read against layer-stack depth, with and without autosquash", runDepth},
	{"i", "file_read and publish against repository size", runRepoSize},
}

// Run starts the product and runs the chosen scenarios in order.
func Run(ctx context.Context, o Options) (*Suite, error) {
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if len(o.Agents) == 0 {
		o.Agents = []int{1, 5, 20, 50}
	}
	if o.AgentTime <= 0 {
		o.AgentTime = 20 * time.Second
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return nil, err
	}
	s := &Suite{o: o, Rec: &Recorder{}, Machine: machine(ctx)}
	o.Stack.StateDir = filepath.Join(o.WorkDir, "state")
	if len(o.Stack.AllowRoots) == 0 {
		o.Stack.AllowRoots = []string{o.WorkDir} // the repositories and worktrees live here
	}
	o.Stack.Log = o.Log
	st, err := StartStack(ctx, o.Stack)
	if err != nil {
		return nil, fmt.Errorf("start the product: %w", err)
	}
	defer st.Close()
	s.st = st
	s.Machine["docker"], _ = st.Acts.DockerVersion(ctx)
	for _, sc := range scenarios {
		if !s.want(sc.key) {
			continue
		}
		o.Log.Info("scenario", "key", sc.key, "title", sc.title)
		SettleDisk() // what the scenario before left to write back is not this one's cost
		start := time.Now()
		sec, err := sc.run(ctx, s)
		if err != nil {
			return s, fmt.Errorf("scenario %s (%s): %w", sc.key, sc.title, err)
		}
		sec.Key, sec.Title = sc.key, sc.title
		sec.Notes = append(sec.Notes, fmt.Sprintf("Scenario wall time: %s.", time.Since(start).Round(time.Second)))
		s.Sections = append(s.Sections, sec)
		o.Log.Info("scenario done", "key", sc.key, "seconds", time.Since(start).Seconds())
	}
	s.Machine["load_after"] = loadAvg()
	return s, nil
}

// --- formatting helpers for the scenarios ---

func fms(d time.Duration) string { return fmt.Sprintf("%v", Ms(d)) }

func ratio(base, ours time.Duration) string {
	if ours <= 0 || base <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1fx", float64(base)/float64(ours))
}

// ratioFine is ratio with two significant digits, for baselines that are
// orders of magnitude apart (an in-process file read against an RPC).
func ratioFine(base, ours time.Duration) string {
	if ours <= 0 || base <= 0 {
		return "–"
	}
	return sig2(float64(base)/float64(ours)) + "x"
}

// sig2 is r with two significant digits, never in exponent form (103,
// not 1e+02).
func sig2(r float64) string {
	if math.Abs(r) >= 100 {
		return strconv.FormatFloat(math.Round(r), 'f', -1, 64)
	}
	return strconv.FormatFloat(r, 'g', 2, 64)
}

// sig3 is a target's ratio: three significant digits, so that a ratio
// just under its goal (14.6x against 15x) does not read as the goal.
func sig3(r float64) string {
	if math.Abs(r) >= 100 {
		return strconv.FormatFloat(math.Round(r), 'f', -1, 64)
	}
	return strconv.FormatFloat(r, 'g', 3, 64)
}

func fops(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func bytesStr(n int64) string {
	switch {
	case n < 0:
		return "?"
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// summaryRow renders "p50 / p95 / p99 (ops/s)" cells of a summary.
func summaryCells(sm Summary) []string {
	cells := []string{fms(sm.P50), fms(sm.P95), fms(sm.P99)}
	if sm.OpsPerSec > 0 {
		cells = append(cells, fops(sm.OpsPerSec))
	} else {
		cells = append(cells, "–")
	}
	return append(cells, samplesCell(sm))
}

// samplesCell is the sample count, with the failures when there were any.
func samplesCell(sm Summary) string {
	if sm.Errors > 0 {
		return fmt.Sprintf("%d (%d failed)", sm.N, sm.Errors)
	}
	return fmt.Sprint(sm.N)
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func machine(ctx context.Context) map[string]string {
	m := map[string]string{"load_before": loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") && m["cpu"] == "" {
				m["cpu"] = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
			}
			if strings.HasPrefix(l, "processor") {
				n++
			}
		}
		m["cores"] = fmt.Sprint(n)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m["memory"] = strings.TrimSpace(strings.SplitN(strings.SplitN(string(b), "\n", 2)[0], ":", 2)[1])
	}
	m["docker_disk"] = diskOf("/var/lib/docker")
	return m
}

// diskOf names the file system path is on and, for ext4, whether it has a
// journal: without one, every file or directory create scans the inodes
// freed in the last minutes (internal/spreaddir's doc), so a run's
// absolute figures depend on how much the runs before it deleted.
func diskOf(path string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "?"
	}
	var best, fstype, dev string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		mp := f[4]
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, fstype, dev = mp, f[sep+1], f[sep+2]
		}
	}
	if fstype != "ext4" {
		return fstype
	}
	j, err := os.ReadFile(filepath.Join("/sys/fs/ext4", filepath.Base(dev), "journal_task"))
	switch {
	case err != nil:
		return "ext4"
	case strings.TrimSpace(string(j)) == "<none>":
		return "ext4 without a journal (" + dev + ")"
	}
	return "ext4 with a journal (" + dev + ")"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
