package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// content4k is 4096 bytes of text: 64 lines of 63 characters and a newline.
var content4k = func() string {
	var sb strings.Builder
	for i := 0; i < 64; i++ {
		line := fmt.Sprintf("line %02d ", i)
		sb.WriteString(line + strings.Repeat("x", 63-len(line)) + "\n")
	}
	return sb.String()
}()

// smallSandbox creates a sandbox over a small repository (20 files and a
// 4 KiB file) and a baseline container of the same image.
func (s *Suite) smallSandbox(ctx context.Context, name string) (id string, base *Baseline, cleanup func(), err error) {
	root := filepath.Join(s.o.WorkDir, name)
	_ = os.RemoveAll(root)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", nil, nil, err
	}
	if err := MakeRepo(root, 20, 1024); err != nil {
		return "", nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "f4k.txt"), []byte(content4k), 0o644); err != nil {
		return "", nil, nil, err
	}
	id, err = s.st.CreateSandbox(ctx, s.o.Image, root)
	if err != nil {
		return "", nil, nil, err
	}
	base, err = StartBaseline(ctx, s.st.Docker, s.o.Image)
	if err != nil {
		s.st.DestroySandbox(id)
		return "", nil, nil, err
	}
	if _, err := DockerExec(ctx, s.st.Docker, base.ID, []string{"sh", "-c", "cat > /f4k.txt"}, []byte(content4k)); err != nil {
		base.Close()
		s.st.DestroySandbox(id)
		return "", nil, nil, err
	}
	return id, base, func() { base.Close(); s.st.DestroySandbox(id) }, nil
}

// runCommand: `true` in a session through the gateway vs docker exec into a
// running container, at concurrency 1 and 5.
func runCommand(ctx context.Context, s *Suite) (Section, error) {
	id, base, cleanup, err := s.smallSandbox(ctx, "cmd")
	if err != nil {
		return Section{}, err
	}
	defer cleanup()
	t := Table{Header: []string{"c", "ours p50", "p95", "p99", "ops/s", "samples", "docker exec p50", "p95", "p99", "ops/s", "samples", "latency ratio", "throughput ratio"}}
	var roundNotes []string
	for _, c := range []int{1, 5} {
		sessions := make([]string, c)
		for i := range sessions {
			if sessions[i], err = s.st.Session(ctx, id, fmt.Sprintf("bench-%d", i)); err != nil {
				return Section{}, err
			}
		}
		// Rounds of ours then docker exec, the table pooling them and the
		// target the median of the rounds' ratios.
		var ow, dw time.Duration
		var rounds Rounds
		for r := 0; r < benchRounds; r++ {
			mark := s.Rec.Len()
			ow += Load(s.Rec, "a", "ours", "exec", c, max(3, s.n(300)/benchRounds), func(w, i int) error {
				return s.st.Exec(ctx, id, sessions[w], "true")
			})
			dw += Load(s.Rec, "a", "docker exec", "exec", c, max(3, s.n(40)/benchRounds), func(w, i int) error {
				_, err := DockerExec(ctx, s.st.Docker, base.ID, []string{"true"}, nil)
				return err
			})
			rounds.Add(s.Rec.P50Since(mark, "a", "docker exec"), s.Rec.P50Since(mark, "a", "ours"))
		}
		ours := s.summary("a", "ours", "exec", c, ow)
		dock := s.summary("a", "docker exec", "exec", c, dw)
		row := append([]string{fmt.Sprint(c)}, summaryCells(ours)...)
		row = append(row, summaryCells(dock)...)
		row = append(row, ratio(dock.P50, ours.P50), fmt.Sprintf("%.1fx", ours.OpsPerSec/dock.OpsPerSec))
		t.Rows = append(t.Rows, row)
		roundNotes = append(roundNotes, fmt.Sprintf("c=%d, docker exec p50 / ours p50 per round: %s.", c, rounds))
		if c == 1 {
			s.fasterRounds("exec in a session (c=1)", ours.P50, dock.P50, "`docker exec`", rounds, 25)
		}
		for _, ws := range sessions {
			_, _ = s.st.Call(ctx, "destroy_workspace_session", id, map[string]any{"workspace_session_id": ws})
		}
	}
	return Section{Intro: "`exec_command` of `true` in an existing workspace session, through the gateway over HTTP " +
		"(the runtime path: gateway → daemon RPC → libcontainer exec), against `docker exec <container> true` through the Docker " +
		"Engine API (exec create, attached start read to the end, inspect) into a running container of the same image — what a " +
		"container-per-agent tool does for every command. Latencies in ms; each worker of the c columns has its own session.",
		Tables: []Table{t}, Notes: roundNotes}, nil
}

// runSessionCreate: create_workspace_session (durable, through Temporal)
// vs a fresh container (docker run) vs git worktree add.
func runSessionCreate(ctx context.Context, s *Suite) (Section, error) {
	repo, id, destroy, err := s.repoSandbox(ctx, "repo-1k", 1000)
	if err != nil {
		return Section{}, err
	}
	defer destroy()
	var idle []string
	var wtDisk int64 = -1
	var ow, dw, gw time.Duration
	var dockRounds, gitRounds Rounds
	local, stopProfile := s.profileTimed(ctx, "session-create", id)
	defer stopProfile()
	for r := 0; r < benchRounds; r++ {
		mark := s.Rec.Len()
		local.resume()
		ow += Load(s.Rec, "b", "ours", "create_session", 1, max(3, s.n(40)/benchRounds), func(w, i int) error {
			t0 := time.Now()
			ws, err := s.st.Session(ctx, id, "bench")
			if err != nil {
				return err
			}
			if i >= 0 { // the parts, for the table (the sample is their sum, as docker run's includes its remove)
				s.Rec.Add(Sample{Scenario: "b", Case: "ours, create", Op: "create_session", Concurrency: 1, Latency: time.Since(t0)})
			}
			if i < 0 || len(idle) >= 3 {
				t1 := time.Now()
				_, err = s.st.Call(ctx, "destroy_workspace_session", id, map[string]any{"workspace_session_id": ws})
				if i >= 0 {
					s.Rec.Add(Sample{Scenario: "b", Case: "ours, destroy", Op: "create_session", Concurrency: 1, Latency: time.Since(t1), Err: err != nil})
				}
				return err
			}
			idle = append(idle, ws) // kept for the disk measurement
			return nil
		})
		local.pause()
		// A create right after a publish (the head moved): what an agent
		// that publishes and goes on in a new session waits for.
		Load(s.Rec, "b", "ours, after a publish", "create_session", 1, max(3, s.n(15)/benchRounds), func(w, i int) error {
			ws, err := s.st.Session(ctx, id, "bench")
			if err != nil {
				return err
			}
			if _, err := s.st.Call(ctx, "file_write", id, map[string]any{"workspace_session_id": ws, "path": fmt.Sprintf("after-publish/%d-%d.txt", r, i+1), "content": "x\n"}); err != nil {
				return err
			}
			if _, err := s.st.Call(ctx, "publish_workspace_session", id, map[string]any{"workspace_session_id": ws}); err != nil {
				return err
			}
			t0 := time.Now()
			ws, err = s.st.Session(ctx, id, "bench")
			if err != nil {
				return err
			}
			if i >= 0 {
				s.Rec.Add(Sample{Scenario: "b", Case: "ours, create after a publish", Op: "create_session", Concurrency: 1, Latency: time.Since(t0)})
			}
			_, err = s.st.Call(ctx, "destroy_workspace_session", id, map[string]any{"workspace_session_id": ws})
			return err
		})
		dw += Load(s.Rec, "b", "docker run", "create_session", 1, max(3, s.n(15)/benchRounds), func(w, i int) error {
			return DockerRun(ctx, s.st.Docker, s.o.Image, []string{"true"})
		})
		gw += Load(s.Rec, "b", "git worktree add", "create_session", 1, max(3, s.n(15)/benchRounds), func(w, i int) error {
			dst := filepath.Join(s.o.WorkDir, fmt.Sprintf("wt-b-%d-%d", r, i+1))
			rm, err := GitWorktree(repo, dst)
			if err != nil {
				return err
			}
			if wtDisk < 0 {
				wtDisk = DiskBytes(dst)
			}
			rm()
			return nil
		})
		ours := s.Rec.P50Since(mark, "b", "ours")
		dockRounds.Add(s.Rec.P50Since(mark, "b", "docker run"), ours)
		gitRounds.Add(s.Rec.P50Since(mark, "b", "git worktree add"), ours)
	}
	ours := s.summary("b", "ours", "create_session", 0, ow)
	dock := s.summary("b", "docker run", "create_session", 0, dw)
	git := s.summary("b", "git worktree add", "create_session", 0, gw)
	t := Table{Header: []string{"", "p50", "p95", "p99", "ops/s", "samples", "ours vs it (p50)"}}
	t.Rows = append(t.Rows, append(append([]string{"ours: create_workspace_session (and destroy_workspace_session)"}, summaryCells(ours)...), "1x"))
	for _, part := range []string{"create", "destroy"} {
		ps := s.summary("b", "ours, "+part, "create_session", 0, 0)
		t.Rows = append(t.Rows, append(append([]string{"… of which " + part + "_workspace_session"}, summaryCells(ps)...), "–"))
	}
	after := s.summary("b", "ours, create after a publish", "create_session", 0, 0)
	t.Rows = append(t.Rows, append(append([]string{"ours: create_workspace_session right after a publish (the head moved; destroy not counted)"}, summaryCells(after)...), "–"))
	t.Rows = append(t.Rows, append(append([]string{"docker run (create, start, wait, remove)"}, summaryCells(dock)...), ratio(dock.P50, ours.P50)))
	t.Rows = append(t.Rows, append(append([]string{"git worktree add (1k files)"}, summaryCells(git)...), ratio(git.P50, ours.P50)))
	s.fasterRounds("session create, durable", ours.P50, dock.P50, "`docker run`", dockRounds, 15)
	s.fasterRounds("session create, durable, 1k-file repository", ours.P50, git.P50, "`git worktree add`", gitRounds, 10)

	disk := Table{Caption: "Disk of one new, idle agent workspace", Header: []string{"", "bytes"}}
	for i, ws := range idle {
		disk.Rows = append(disk.Rows, []string{fmt.Sprintf("ours: idle session %d (its whole session dir)", i+1),
			bytesStr(ContainerDiskBytes(ctx, s.st.Docker, id, "/eos/sessions/"+ws))})
	}
	disk.Rows = append(disk.Rows, []string{"git worktree of the 1k-file repository (4 MiB of files)", bytesStr(wtDisk)})
	return Section{Intro: "`create_workspace_session` through the gateway — a durable Temporal update on the sandbox's workflow, " +
		"the daemon's libcontainer session (namespaces, seccomp, cgroup, overlay mount), and its `destroy_workspace_session` (the " +
		"baselines remove theirs too) — over a 1,000-file repository (the first 3 sessions of the run are kept, for the disk table), against " +
		"the two other ways to give an agent its own workspace: a fresh container from the same image (`docker run --rm <image> true` " +
		"through the Engine API; peers such as container-use start one per agent) and `git worktree add` of the same repository. " +
		"A further row times a create right after a publish of a one-file change (a session created, written, published, then the " +
		"timed create): the head moved since the warm sessions were built. Latencies in ms, c=1.", Tables: []Table{t, disk}}, nil
}

// ensureRepo makes a repository once per suite run.
func ensureRepo(dir string, n, size int) error {
	if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
		return pruneRepo(dir)
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return MakeRepo(dir, n, size)
}

// pruneRepo returns a reused repository to the state MakeRepo left: a run
// interrupted inside a git baseline leaves its worktree registered (the
// next run's worktree of that name would fail) and its commits' objects in
// the store, which a sandbox of the repository and a container + copy of
// it would both copy. Scenarios run one at a time and remove their
// worktrees before they end, so any worktree found here is a leftover.
func pruneRepo(dir string) error {
	git := func(args ...string) ([]byte, error) {
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("git %v in %s: %v: %s", args, dir, err, out)
		}
		return out, nil
	}
	list, err := git("worktree", "list", "--porcelain")
	if err != nil {
		return err
	}
	left := false
	for i, l := range strings.Split(string(list), "\n") {
		if wt, ok := strings.CutPrefix(l, "worktree "); ok && i > 0 { // the first is the repository itself
			if _, err := git("worktree", "remove", "--force", wt); err != nil {
				return err
			}
			left = true
		}
	}
	out, err := git("count-objects")
	if err != nil {
		return err
	}
	if !left && strings.HasPrefix(string(out), "0 objects") {
		return nil
	}
	for _, args := range [][]string{{"worktree", "prune"}, {"gc", "-q", "--prune=now"}} {
		if _, err := git(args...); err != nil {
			return err
		}
	}
	return nil
}

// runFiles: 4 KiB file_read and file_write in a session vs docker exec cat
// and a docker exec that writes.
func runFiles(ctx context.Context, s *Suite) (Section, error) {
	id, base, cleanup, err := s.smallSandbox(ctx, "files")
	if err != nil {
		return Section{}, err
	}
	defer cleanup()
	ws, err := s.st.Session(ctx, id, "bench")
	if err != nil {
		return Section{}, err
	}
	rw := Load(s.Rec, "c", "ours", "read", 1, s.n(300), func(w, i int) error {
		m, err := s.st.Call(ctx, "file_read", id, map[string]any{"path": "f4k.txt", "workspace_session_id": ws, "keep_final_newline": true})
		if err == nil && m["content"] != content4k {
			err = fmt.Errorf("file_read returned %d bytes", len(fmt.Sprint(m["content"])))
		}
		return err
	})
	ww := Load(s.Rec, "c", "ours", "write", 1, s.n(300), func(w, i int) error {
		_, err := s.st.Call(ctx, "file_write", id, map[string]any{"path": "w4k.txt", "content": content4k, "workspace_session_id": ws})
		return err
	})
	dr := Load(s.Rec, "c", "docker exec", "read", 1, s.n(40), func(w, i int) error {
		out, err := DockerExec(ctx, s.st.Docker, base.ID, []string{"cat", "/f4k.txt"}, nil)
		if err == nil && string(out) != content4k {
			err = fmt.Errorf("cat returned %d bytes", len(out))
		}
		return err
	})
	dwr := Load(s.Rec, "c", "docker exec", "write", 1, s.n(40), func(w, i int) error {
		_, err := DockerExec(ctx, s.st.Docker, base.ID, []string{"sh", "-c", "cat > /w4k.txt"}, []byte(content4k))
		return err
	})
	t := Table{Header: []string{"op", "ours p50", "p95", "p99", "ops/s", "samples", "docker exec p50", "p95", "p99", "ops/s", "samples", "latency ratio"}}
	for _, op := range []struct {
		name   string
		ow, dw time.Duration
	}{{"read", rw, dr}, {"write", ww, dwr}} {
		ours := s.summary("c", "ours", op.name, 0, op.ow)
		dock := s.summary("c", "docker exec", op.name, 0, op.dw)
		row := append([]string{op.name}, summaryCells(ours)...)
		row = append(row, summaryCells(dock)...)
		t.Rows = append(t.Rows, append(row, ratio(dock.P50, ours.P50)))
	}
	return Section{Intro: "`file_read` of a 4 KiB file and `file_write` of 4 KiB in a workspace session through the gateway, against " +
		"`docker exec <container> cat /f4k.txt` and a `docker exec` that writes 4 KiB from its stdin (`sh -c 'cat > f'`), through the " +
		"Engine API. Latencies in ms, c=1.", Tables: []Table{t}}, nil
}
