package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// changeSet is one publish size: files of size bytes each.
type changeSet struct {
	files, size int
}

func (c changeSet) name() string { return fmt.Sprintf("%d x %s", c.files, bytesStr(int64(c.size))) }

var changeSets = []changeSet{{1, 4 << 10}, {10, 4 << 10}, {100, 4 << 10}, {1000, 4 << 10}, {1, 64 << 10}, {1, 1 << 20}, {1, 3 << 20}}

// runPublishSize: publish_workspace_session of change sets from one 4 KiB
// file to 1,000 files and to a 3 MiB payload, against git add + commit of
// the same files in a worktree.
func runPublishSize(ctx context.Context, s *Suite) (Section, error) {
	repo, id, destroy, err := s.repoSandbox(ctx, "repo-1k", 1000)
	if err != nil {
		return Section{}, err
	}
	defer destroy()
	stop := s.profile(ctx, "publish", id)
	defer stop()
	t := Table{Header: []string{"change set", "ours p50", "p95", "samples", "git add+commit p50", "p95", "samples", "latency ratio"}}
	filesPlot := Plot{File: "publish-files.png", Title: "Publish latency against files changed (4 KiB each)", XLabel: "files in the change set",
		YLabel: "p50 latency (ms)", LogX: true, LogY: true}
	bytesPlot := Plot{File: "publish-bytes.png", Title: "Publish latency against payload (one file)", XLabel: "payload (KiB)",
		YLabel: "p50 latency (ms)", LogX: true, LogY: true}
	ours := map[string]*Series{"files": {Name: "ours: publish_workspace_session"}, "bytes": {Name: "ours: publish_workspace_session"}}
	gits := map[string]*Series{"files": {Name: "git add -A && git commit"}, "bytes": {Name: "git add -A && git commit"}}
	for i, cs := range changeSets {
		n := s.n(8)
		if cs.files >= 1000 {
			n = s.n(4)
		}
		// Each sample's session writes its own directory: the sessions all
		// start from one base, and the same new paths would conflict.
		var sessions []string
		prep := func(k int) (string, error) {
			ws, err := s.st.Session(ctx, id, "bench")
			if err != nil {
				return "", err
			}
			dir := fmt.Sprintf("gen-%d-%d", i, k)
			gen := fmt.Sprintf("mkdir -p %s && i=0; while [ $i -lt %d ]; do head -c %d /dev/urandom > %s/f$i; i=$((i+1)); done", dir, cs.files, cs.size, dir)
			return ws, s.st.Exec(ctx, id, ws, gen)
		}
		for k := 0; k < n+1; k++ { // +1 for the warm-up
			ws, err := prep(k)
			if err != nil {
				return Section{}, fmt.Errorf("prepare %s: %w", cs.name(), err)
			}
			sessions = append(sessions, ws)
		}
		ow := Load(s.Rec, "d", "ours", cs.name(), 1, n, func(w, k int) error {
			_, err := s.st.Call(ctx, "publish_workspace_session", id, map[string]any{"workspace_session_id": sessions[k+1]})
			return err
		})
		wt := filepath.Join(s.o.WorkDir, fmt.Sprintf("wt-d-%d", i))
		rm, err := CommitWorktree(repo, wt)
		if err != nil {
			return Section{}, err
		}
		gw := Load(s.Rec, "d", "git", cs.name(), 1, n, func(w, k int) error {
			if err := writeRandomFiles(filepath.Join(wt, "gen"), cs, k+2); err != nil {
				return err
			}
			cmd := exec.Command("sh", "-c", "git add -A && git -c user.name=b -c user.email=b@example.invalid commit -qm gen")
			cmd.Dir = wt
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("git commit: %v: %s", err, out)
			}
			return nil
		})
		rm()
		o := s.summary("d", "ours", cs.name(), 0, ow)
		g := s.summary("d", "git", cs.name(), 0, gw)
		t.Rows = append(t.Rows, []string{cs.name(), fms(o.P50), fms(o.P95), samplesCell(o), fms(g.P50), fms(g.P95), samplesCell(g), ratio(g.P50, o.P50)})
		point := func(key string, x float64) {
			ours[key].X, ours[key].Y = append(ours[key].X, x), append(ours[key].Y, Ms(o.P50))
			gits[key].X, gits[key].Y = append(gits[key].X, x), append(gits[key].Y, Ms(g.P50))
		}
		if cs.size == 4<<10 {
			point("files", float64(cs.files))
		}
		if cs.files == 1 {
			point("bytes", float64(cs.size)/1024)
		}
	}
	filesPlot.Series = []Series{*ours["files"], *gits["files"]}
	bytesPlot.Series = []Series{*ours["bytes"], *gits["bytes"]}
	s.Plots = append(s.Plots, filesPlot, bytesPlot)
	return Section{Intro: "`publish_workspace_session` through the gateway (a durable update on the sandbox workflow, a publish " +
		"workflow running prepare, commit and finalize against the daemon: capture of the session's upper dir, the per-path check " +
		"against the head, the layer written and the manifest replaced atomically) for change sets of random (incompressible) " +
		"files, each in a fresh session of a 1,000-file repository; against `git add -A && git commit` of the same files in a " +
		"worktree of the same repository (what an agent on a worktree does to record its change). Latencies in ms, c=1.",
		Tables: []Table{t}}, nil
}

// writeRandomFiles replaces gen/ with the change set (seed varies content).
func writeRandomFiles(dir string, cs changeSet, seed int) error {
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	buf := make([]byte, cs.size)
	for i := 0; i < cs.files; i++ {
		_, _ = rand.Read(buf)
		buf[0] = byte(seed)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// profileTimed is profile for a scenario's timed parts only: this
// process's CPU while resumed (a nil *cpuParts without -profile), the
// daemon's throughout (it only serves the scenario).
func (s *Suite) profileTimed(ctx context.Context, name, sandboxID string) (local *cpuParts, stop func()) {
	if s.o.Profile == "" {
		return nil, func() {}
	}
	_ = os.MkdirAll(s.o.Profile, 0o755)
	local = &cpuParts{}
	stopDaemon := s.st.daemonProfile(ctx, sandboxID, filepath.Join(s.o.Profile, name+"-daemon.pprof"))
	start := time.Now()
	return local, func() {
		_ = local.write(filepath.Join(s.o.Profile, name+"-gateway.pprof"))
		stopDaemon()
		s.Profiles = append(s.Profiles, fmt.Sprintf("%s (%s; this process's only while timed): %s-gateway.pprof, %s-daemon.pprof", name, time.Since(start).Round(time.Second), name, name))
	}
}

// profile records CPU profiles while a scenario runs: this process (the
// gateway, the workers and the embedded Temporal server) and the
// sandbox's daemon. stop writes them.
func (s *Suite) profile(ctx context.Context, name, sandboxID string) (stop func()) {
	if s.o.Profile == "" {
		return func() {}
	}
	_ = os.MkdirAll(s.o.Profile, 0o755)
	stopLocal := startLocalProfile(filepath.Join(s.o.Profile, name+"-gateway.pprof"))
	stopDaemon := s.st.daemonProfile(ctx, sandboxID, filepath.Join(s.o.Profile, name+"-daemon.pprof"))
	start := time.Now()
	return func() {
		stopLocal()
		stopDaemon()
		s.Profiles = append(s.Profiles, fmt.Sprintf("%s (%s): %s-gateway.pprof, %s-daemon.pprof", name, time.Since(start).Round(time.Second), name, name))
	}
}
