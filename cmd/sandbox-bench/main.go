// Command sandbox-bench runs the benchmark suite (package bench) and writes
// bench/results/<date>.md with its tables and ratios, <date>.csv with every
// sample, PNG plots, and CPU profiles of the slowest scenarios.
//
//	make bench                                  # everything, then the Go benchmarks and benchstat
//	go run ./cmd/sandbox-bench -only a,c        # some scenarios
//	go run ./cmd/sandbox-bench -scale 0.2       # a quick look
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeral-sandbox/sandbox/bench"
	"github.com/ephemeral-sandbox/sandbox/worker"
)

func main() { os.Exit(run()) }

func run() int {
	worker.TuneGC() // this process is the gateway of the runs, as sandbox-gateway sets it
	var (
		out        = flag.String("out", "bench/results", "directory of the report, CSV and plots")
		readme     = flag.String("readme", "", "also write the run's targets table into this README's bench-targets block (make bench: README.md)")
		date       = flag.String("date", time.Now().Format("2006-01-02"), "name of this run's files")
		scale      = flag.Float64("scale", 1, "multiply every sample count and duration (0.2: a quick look)")
		agents     = flag.String("agents", "1,5,20,50", "concurrency levels of the parallel-agents scenario")
		agentTime  = flag.Duration("agent-time", 20*time.Second, "how long each level of the parallel-agents scenario runs (before -scale)")
		only       = flag.String("only", "", "comma-separated scenarios to run (a,b,c,d,e,f,g,h,i,p; default all)")
		image      = flag.String("image", "eos-test-busybox:1", "image of the sandboxes and the baseline containers")
		daemon     = flag.String("daemon-binary", "bin/sandbox-daemon", "the static sandbox-daemon (make daemon)")
		daemonArg  = flag.String("daemon-args", "", "more sandbox-daemon flags for every sandbox, space-separated (e.g. '--background-lanes 2')")
		workDir    = flag.String("workdir", filepath.Join(os.TempDir(), "eos-bench"), "scratch: repositories, worktrees, Temporal state")
		profile    = flag.Bool("profile", true, "write CPU profiles of the publish and parallel-agents scenarios")
		verbose    = flag.Bool("v", false, "log the product's own messages too")
		noStandby  = flag.Bool("no-standby", false, "run the gateway without standby sandboxes (sandbox-gateway --standby=false)")
		loopsRef   = flag.String("loops-reference", "", "tree of the loops/s target's reference code, built by scripts/bench-reference.sh (make bench): its scenario (e) and ours run in alternating pairs (-loops-pairs) at the top agent level")
		loopsPairs = flag.Int("loops-pairs", bench.DefaultLoopsPairs, "with -loops-reference: alternating pairs (the reference, then ours) at the top agent count; the loops/s target is their median ratio")
		noConsole  = flag.Bool("no-console", false, "scenario (e) without its console (inspect_sandbox every 250 ms beside the agents)")
	)
	flag.Parse()
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	progress := slog.New(slog.NewTextHandler(os.Stderr, nil))
	o := bench.Options{Image: *image, Scale: *scale, AgentTime: *agentTime, WorkDir: *workDir, Log: log,
		Stack: bench.StackOptions{DaemonBinary: *daemon, DaemonArgs: strings.Fields(*daemonArg), NoStandby: *noStandby}}
	for _, a := range strings.Split(*agents, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(a))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "sandbox-bench: -agents: %q is not a positive number\n", a)
			return 2
		}
		o.Agents = append(o.Agents, n)
	}
	if *only != "" {
		o.Only = strings.Split(*only, ",")
	}
	if *loopsRef != "" {
		ref, err := bench.LoadReference(*loopsRef)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandbox-bench: -loops-reference:", err)
			return 2
		}
		o.LoopsReference = ref
	}
	if *loopsPairs < 1 {
		fmt.Fprintln(os.Stderr, "sandbox-bench: -loops-pairs: want at least 1")
		return 2
	}
	o.LoopsPairs = *loopsPairs
	o.NoConsole = *noConsole
	if *profile {
		o.Profile = filepath.Join(*out, *date+"-profiles")
	}
	_ = os.RemoveAll(*workDir)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	progress.Info("benchmark suite starting", "scale", *scale, "agents", o.Agents, "only", o.Only)
	start := time.Now()
	s, err := bench.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-bench:", err)
		if s == nil || len(s.Sections) == 0 {
			return 1
		}
	}
	cmd := "make bench"
	if len(os.Args) > 1 {
		cmd = "go run ./cmd/sandbox-bench " + strings.Join(os.Args[1:], " ")
	}
	path, werr := s.Write(*out, *date, cmd)
	if werr != nil {
		fmt.Fprintln(os.Stderr, "sandbox-bench: write report:", werr)
		return 1
	}
	if o.Profile != "" {
		writeTops(o.Profile)
	}
	if *readme != "" && len(s.Targets) > 0 {
		rel, rerr := filepath.Rel(filepath.Dir(*readme), path)
		if rerr != nil {
			rel = path
		}
		if werr := s.WriteReadme(*readme, rel); werr != nil {
			fmt.Fprintln(os.Stderr, "sandbox-bench: README:", werr)
			return 1
		}
	}
	progress.Info("benchmark suite done", "report", path, "minutes", time.Since(start).Minutes())
	if err != nil {
		return 1
	}
	return 0
}

// writeTops renders `go tool pprof -top` of each profile next to it, so the
// report's readers need no tools to see where the time went.
func writeTops(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.pprof"))
	for _, f := range files {
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount", "40", f).CombinedOutput()
		if err == nil {
			_ = os.WriteFile(strings.TrimSuffix(f, ".pprof")+"-top.txt", out, 0o644)
		}
	}
}
