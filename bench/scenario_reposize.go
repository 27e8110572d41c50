package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// repoSizes are the repository sizes (files of 4 KiB) of scenario (i).
var repoSizes = []int{1000, 20000, 100000}

// runRepoSize: file_read and a one-file publish against the size of the
// repository the sandbox was created over, beside a worktree of the same
// repository (a read of the file, git add && git commit of the change).
func runRepoSize(ctx context.Context, s *Suite) (Section, error) {
	t := Table{Header: []string{"files", "file_read p50", "p99", "publish (1 file) p50", "p99", "cat (worktree) p50",
		"git add+commit p50", "file_read ratio", "publish ratio"}}
	plot := Plot{File: "reposize.png", Title: "Latency against repository size (p50)", XLabel: "files in the repository",
		YLabel: "latency (ms)", LogX: true, LogY: true}
	ours, rd, gits := Series{Name: "ours: publish (1 file)"}, Series{Name: "ours: file_read"}, Series{Name: "git add -A && git commit"}
	for _, n := range repoSizes {
		repo, id, destroy, err := s.repoSandbox(ctx, fmt.Sprintf("repo-%d", n), n)
		if err != nil {
			return Section{}, fmt.Errorf("%d files: %w", n, err)
		}
		cas := fmt.Sprint(n)
		ws, err := s.st.Session(ctx, id, "size")
		if err != nil {
			destroy()
			return Section{}, err
		}
		// MakeRepo's files: pkg<dir>/file<i>.txt in directories of 100.
		file := "pkg000/file00000.txt"
		if _, err := os.Stat(filepath.Join(repo, file)); err != nil {
			file = firstFile(repo)
		}
		rw := Load(s.Rec, "i", cas, "file_read", 1, s.n(100), func(_, _ int) error {
			_, err := s.st.Call(ctx, "file_read", id, map[string]any{"workspace_session_id": ws, "path": file})
			return err
		})
		pw := Load(s.Rec, "i", cas, "publish", 1, s.n(10), func(_, k int) error {
			if err := s.st.Exec(ctx, id, ws, fmt.Sprintf("echo %d > size-%d.txt", k, k+1)); err != nil {
				return err
			}
			_, err := s.st.Call(ctx, "publish_workspace_session", id, map[string]any{"workspace_session_id": ws, "keep": true})
			return err
		})
		destroy()
		wt := filepath.Join(s.o.WorkDir, fmt.Sprintf("wt-i-%d", n))
		rm, err := GitWorktree(repo, wt)
		if err != nil {
			return Section{}, err
		}
		cw := Load(s.Rec, "i", cas, "cat", 1, s.n(100), func(_, _ int) error {
			_, err := os.ReadFile(filepath.Join(wt, file))
			return err
		})
		gw := Load(s.Rec, "i", cas, "git commit", 1, s.n(10), func(_, k int) error {
			if err := os.WriteFile(filepath.Join(wt, fmt.Sprintf("size-%d.txt", k+1)), []byte(fmt.Sprintln(k)), 0o644); err != nil {
				return err
			}
			return gitCommitAll(wt, "size")
		})
		rm()
		r, p := s.summary("i", cas, "file_read", 0, rw), s.summary("i", cas, "publish", 0, pw)
		c, g := s.summary("i", cas, "cat", 0, cw), s.summary("i", cas, "git commit", 0, gw)
		t.Rows = append(t.Rows, []string{fmt.Sprint(n), fms(r.P50), fms(r.P99), fms(p.P50), fms(p.P99), fms(c.P50), fms(g.P50),
			ratioFine(c.P50, r.P50), ratio(g.P50, p.P50)})
		for _, x := range []struct {
			s *Series
			v float64
		}{{&ours, Ms(p.P50)}, {&rd, Ms(r.P50)}, {&gits, Ms(g.P50)}} {
			x.s.X, x.s.Y = append(x.s.X, float64(n)), append(x.s.Y, x.v)
		}
		SettleDisk()
	}
	plot.Series = []Series{ours, rd, gits}
	s.Plots = append(s.Plots, plot)
	return Section{Intro: fmt.Sprintf("A sandbox over a repository of %v files of 4 KiB each: `file_read` of one of its files "+
		"and `publish_workspace_session` (with `keep`) of a one-file change, c = 1, through the gateway; beside a worktree of the same "+
		"repository: reading the file, and `git add -A && git commit` of the same change (git's index grows with the "+
		"repository).", repoSizes), Tables: []Table{t}}, nil
}

// firstFile is some regular file of the repository outside .git.
func firstFile(repo string) string {
	var found string
	_ = filepath.WalkDir(repo, func(p string, d os.DirEntry, err error) error {
		if err != nil || found != "" {
			return filepath.SkipDir
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			found, _ = filepath.Rel(repo, p)
			return filepath.SkipAll
		}
		return nil
	})
	return found
}
