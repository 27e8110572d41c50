package bench

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
)

// runSmallPublish: the small-publish target, one 4 KiB file,
// durable, beside `git add -A && git commit` of the same file in a worktree
// of the same 1,000-file repository, in alternating rounds of the same run
// (the machine is shared: ratios of the same round mean more than
// absolutes). Each round's p50s, and the median of the rounds' ratios.
func runSmallPublish(ctx context.Context, s *Suite) (Section, error) {
	repo, id, destroy, err := s.repoSandbox(ctx, "repo-1k", 1000)
	if err != nil {
		return Section{}, err
	}
	defer destroy()
	cs := changeSet{1, 4 << 10}
	rounds, n := s.n(5), s.n(10)
	wt := filepath.Join(s.o.WorkDir, "wt-p")
	rm, err := GitWorktree(repo, wt)
	if err != nil {
		return Section{}, err
	}
	defer rm()
	t := Table{Header: []string{"round", "ours p50", "p95", "samples", "git add+commit p50", "p95", "samples", "git p50 / ours p50"}}
	var ratios []float64
	for r := 0; r < rounds; r++ {
		var sessions []string
		for k := 0; k < n+1; k++ { // +1 for the warm-up
			ws, err := s.st.Session(ctx, id, "bench")
			if err != nil {
				return Section{}, err
			}
			dir := fmt.Sprintf("small-%d-%d", r, k)
			if err := s.st.Exec(ctx, id, ws, fmt.Sprintf("mkdir -p %s && head -c %d /dev/urandom > %s/f0", dir, cs.size, dir)); err != nil {
				return Section{}, err
			}
			sessions = append(sessions, ws)
		}
		cas := fmt.Sprintf("round %d", r+1)
		ow := Load(s.Rec, "p", "ours", cas, 1, n, func(w, k int) error {
			_, err := s.st.Call(ctx, "publish_workspace_session", id, map[string]any{"workspace_session_id": sessions[k+1]})
			return err
		})
		gw := Load(s.Rec, "p", "git", cas, 1, n, func(w, k int) error {
			if err := writeRandomFiles(filepath.Join(wt, "gen"), cs, r*1000+k+2); err != nil {
				return err
			}
			cmd := exec.Command("sh", "-c", "git add -A && git -c user.name=b -c user.email=b@example.invalid commit -qm gen")
			cmd.Dir = wt
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("git commit: %v: %s", err, out)
			}
			return nil
		})
		o := s.summary("p", "ours", cas, 0, ow)
		g := s.summary("p", "git", cas, 0, gw)
		if o.P50 > 0 {
			ratios = append(ratios, float64(g.P50)/float64(o.P50))
		}
		t.Rows = append(t.Rows, []string{cas, fms(o.P50), fms(o.P95), samplesCell(o), fms(g.P50), fms(g.P95), samplesCell(g), ratio(g.P50, o.P50)})
	}
	sort.Float64s(ratios)
	med := 0.0
	if len(ratios) > 0 {
		med = ratios[len(ratios)/2]
	}
	sec := Section{Intro: "`publish_workspace_session` of one 4 KiB file, durable (the sandbox workflow's update handler and one exactly-once daemon " +
		"call: capture, the per-path check against the head, the layer written and the manifest replaced atomically, the commit recorded; " +
		"the session closed after the answer), each in a fresh session of a 1,000-file repository, c=1; beside `git add -A && git commit` " +
		"of the same file in a worktree of the same repository, in alternating rounds of the same run. Latencies in ms.",
		Tables: []Table{t}}
	sec.Notes = append(sec.Notes, fmt.Sprintf("Median over %d rounds of git p50 / ours p50: %.1fx (target ≥ 3x).", len(ratios), med))
	return sec, nil
}
