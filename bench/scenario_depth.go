package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/ephemeral-sandbox/sandbox/activities"
)

// depthLevels are the layer-stack depths of scenario (h).
var depthLevels = []int{1, 10, 100, 500}

// runDepth: publish and file_read latency against the number of layers
// published over the base, with the daemon's autosquash (default: squash
// past 100 layers) and without it, beside git: a commit and a read of the
// same file in a worktree whose history has as many commits.
func runDepth(ctx context.Context, s *Suite) (Section, error) {
	t := Table{Header: []string{"layers published", "autosquash", "publish p50", "p99", "file_read p50", "p99",
		"git commit p50", "cat (worktree) p50", "publish ratio", "file_read ratio"}}
	plot := Plot{File: "depth.png", Title: "Latency against layers published (p50)", XLabel: "layers published over the base",
		YLabel: "latency (ms)", LogX: true, LogY: true}
	series := map[string]*Series{}
	point := func(name string, x int, y float64) {
		if series[name] == nil {
			series[name] = &Series{Name: name}
		}
		series[name].X, series[name].Y = append(series[name].X, float64(x)), append(series[name].Y, y)
	}
	var order []string
	var notes []string
	for i, mode := range []struct {
		name string
		args []string
	}{{"at 100 (default)", nil}, {"off", []string{"-autosquash-at", "-1"}}} {
		// Flags of the sandboxes created from now on; the next mode's
		// sandbox is created after this one is gone.
		activities.SetDaemonArgs(s.st.Acts, append(append([]string(nil), s.o.Stack.DaemonArgs...), mode.args...))
		rows, stopped, err := s.depthRun(ctx, i, mode.name)
		activities.SetDaemonArgs(s.st.Acts, s.o.Stack.DaemonArgs)
		if err != nil {
			return Section{}, fmt.Errorf("autosquash %s: %w", mode.name, err)
		}
		if stopped != "" {
			notes = append(notes, fmt.Sprintf("Autosquash %s: %s", mode.name, stopped))
		}
		for _, r := range rows {
			t.Rows = append(t.Rows, []string{fmt.Sprint(r.depth), mode.name, fms(r.pub.P50), fms(r.pub.P99), fms(r.read.P50), fms(r.read.P99),
				fms(r.git.P50), fms(r.cat.P50), ratio(r.git.P50, r.pub.P50), ratioFine(r.cat.P50, r.read.P50)})
			for _, p := range []struct {
				name string
				v    float64
			}{{"publish, autosquash " + mode.name, Ms(r.pub.P50)}, {"file_read, autosquash " + mode.name, Ms(r.read.P50)},
				{"git commit (" + mode.name + " run)", Ms(r.git.P50)}} {
				if series[p.name] == nil {
					order = append(order, p.name)
				}
				point(p.name, r.depth, p.v)
			}
		}
	}
	for _, name := range order {
		plot.Series = append(plot.Series, *series[name])
	}
	s.Plots = append(s.Plots, plot)
	return Section{Intro: fmt.Sprintf("One sandbox over a 20-file repository and one session that publishes a one-file change "+
		"(`publish_workspace_session` with `keep`) again and again, so the stack grows to %v layers over the base; at each depth "+
		"the latency of the publishes that led there (the last 10 at most) and of `file_read` of a 4 KiB file of the base "+
		"from a fresh session (its lookup passes every layer). Once with the daemon's autosquash (squash past 100 layers), once "+
		"without (`-autosquash-at -1`). Baseline in the same run: `git add && git commit` in a worktree with as many commits, "+
		"and `cat` of the same file there.", depthLevels), Tables: []Table{t}, Notes: notes}, nil
}

type depthRow struct {
	depth               int
	pub, read, git, cat Summary
}

// depthRun grows one sandbox's stack through depthLevels. A publish or
// read that fails ends the run there: stopped says where and why (the
// rows so far stand).
func (s *Suite) depthRun(ctx context.Context, run int, mode string) (rows []depthRow, stopped string, _ error) {
	root := filepath.Join(s.o.WorkDir, fmt.Sprintf("depth-%d", run))
	_ = os.RemoveAll(root)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, "", err
	}
	if err := MakeRepo(root, 20, 1024); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(root, "f4k.txt"), []byte(content4k), 0o644); err != nil {
		return nil, "", err
	}
	if err := gitCommitAll(root, "f4k"); err != nil {
		return nil, "", err
	}
	id, err := s.st.CreateSandbox(ctx, s.o.Image, root)
	if err != nil {
		return nil, "", err
	}
	defer s.st.DestroySandbox(id)
	wt := filepath.Join(s.o.WorkDir, fmt.Sprintf("wt-depth-%d", run))
	_ = os.RemoveAll(wt)
	rmWT, err := CommitWorktree(root, wt)
	if err != nil {
		return nil, "", err
	}
	defer rmWT()
	ws, err := s.st.Session(ctx, id, "depth")
	if err != nil {
		return nil, "", err
	}
	cas := "autosquash " + mode
	done := 0
	for _, depth := range depthLevels {
		op := fmt.Sprintf("publish@%d", depth)
		gop := fmt.Sprintf("git commit@%d", depth)
		for done < depth {
			k := done
			timed := depth-k <= 10
			write := func() error {
				return s.st.Exec(ctx, id, ws, fmt.Sprintf("echo %d > layer-%d.txt", k, k))
			}
			if err := write(); err != nil {
				return rows, fmt.Sprintf("writing the change for layer %d failed: %v", k+1, err), nil
			}
			pub := func(_, _ int) error {
				_, err := s.st.Call(ctx, "publish_workspace_session", id, map[string]any{"workspace_session_id": ws, "keep": true})
				return err
			}
			gitc := func(_, _ int) error {
				if err := os.WriteFile(filepath.Join(wt, fmt.Sprintf("layer-%d.txt", k)), []byte(fmt.Sprintln(k)), 0o644); err != nil {
					return err
				}
				return gitCommitAll(wt, fmt.Sprint("layer ", k))
			}
			var perr error
			if timed {
				loadNoWarmup(s.Rec, "h", cas, op, 1, func(int) error { perr = pub(0, 0); return perr })
				loadNoWarmup(s.Rec, "h", cas, gop, 1, func(int) error { return gitc(0, 0) })
			} else {
				perr = pub(0, 0)
				if perr == nil {
					perr = gitc(0, 0)
				}
			}
			if perr != nil {
				return rows, fmt.Sprintf("publishing layer %d failed: %v", k+1, perr), nil
			}
			done++
		}
		reader, err := s.st.Session(ctx, id, "depth-reader")
		if err != nil {
			return rows, fmt.Sprintf("a session over %d layers could not be created: %v", depth, err), nil
		}
		rop := fmt.Sprintf("file_read@%d", depth)
		rw := Load(s.Rec, "h", cas, rop, 1, s.n(100), func(_, _ int) error {
			_, err := s.st.Call(ctx, "file_read", id, map[string]any{"workspace_session_id": reader, "path": "f4k.txt"})
			return err
		})
		_, _ = s.st.Call(ctx, "destroy_workspace_session", id, map[string]any{"workspace_session_id": reader})
		cop := fmt.Sprintf("cat@%d", depth)
		cw := Load(s.Rec, "h", cas, cop, 1, s.n(100), func(_, _ int) error {
			_, err := os.ReadFile(filepath.Join(wt, "f4k.txt"))
			return err
		})
		rows = append(rows, depthRow{depth: depth,
			pub: s.summary("h", cas, op, 0, 0), git: s.summary("h", cas, gop, 0, 0),
			read: s.summary("h", cas, rop, 0, rw), cat: s.summary("h", cas, cop, 0, cw)})
	}
	return rows, "", nil
}

func gitCommitAll(dir, msg string) error {
	cmd := exec.Command("sh", "-c", "git add -A && git -c user.name=b -c user.email=b@example.invalid commit -qm \"$0\"", msg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("git commit: %v: %s", err, out)
	}
	return nil
}
