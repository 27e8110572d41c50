package bench

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/docker/docker/api/types/container"
)

// agents is the team size of scenario (f)'s second table.
const agents = 5

// runSandboxCreate: create_sandbox over a 1k-file and a 20k-file repository
// against what a container-per-agent tool does for one agent (a container
// of the image with a copy of the repository, started) and against
// git worktree add.
func runSandboxCreate(ctx context.Context, s *Suite) (Section, error) {
	t := Table{Header: []string{"repository", "ours: create_sandbox p50", "max", "samples", "ours without a standby p50", "container + copy p50", "max", "samples",
		"git worktree add p50", "samples", "container / ours"}}
	t5 := Table{Caption: fmt.Sprintf("%d agents: one create_sandbox and %d create_workspace_session against %d containers + copies, "+
		"one after another, total ms", agents, agents, agents),
		Header: []string{"repository", fmt.Sprintf("ours: create + %d sessions p50", agents), "samples",
			fmt.Sprintf("%d containers + copies p50", agents), "samples", "containers / ours"}}
	for _, r := range []struct {
		name    string
		files   int
		samples int
	}{{"1k files (4 MiB)", 1000, 3}, {"20k files (80 MiB)", 20000, 2}} {
		repo := filepath.Join(s.o.WorkDir, fmt.Sprintf("repo-%d", r.files))
		if r.files == 1000 {
			repo = filepath.Join(s.o.WorkDir, "repo-1k")
		}
		if err := ensureRepo(repo, r.files, 4096); err != nil {
			return Section{}, err
		}
		n := s.n(r.samples)
		// One at a time, each removed (untimed) before the next and the
		// disk settled, so every create starts from the same state; no
		// warm-up: creates are cold by nature.
		// Standby sandboxes are the product's default: before each timed
		// create the gateway's standby of the image is made, as it is
		// for a user whose creates are more than a second or two apart
		// (the cold rows drop it first).
		settle := func() { _ = s.st.SettleStandby(ctx, s.o.Image) }
		cold := func() { settle(); s.st.Backend.DropStandbys() }
		timedN := func(n int, cas string, before func(), create func() (cleanup func(), err error)) time.Duration {
			var total time.Duration
			for i := 0; i < n; i++ {
				before()
				SettleDisk()
				t0 := time.Now()
				cleanup, err := create()
				d := time.Since(t0)
				total += d
				s.Rec.Add(Sample{Scenario: "f", Case: cas, Op: r.name, Concurrency: 1, Latency: d, Err: err != nil})
				if cleanup != nil {
					cleanup()
				}
			}
			return total
		}
		timed := func(cas string, create func() (cleanup func(), err error)) time.Duration {
			return timedN(n, cas, settle, create)
		}
		ours := func() (func(), error) {
			id, err := s.st.CreateSandboxOnly(ctx, s.o.Image, repo)
			return func() {
				if id != "" {
					s.st.DestroySandbox(id)
				}
			}, err
		}
		ow := timed("ours", ours)
		var owCold time.Duration
		if s.st.Backend.Standby.Enabled {
			owCold = timedN(n, "ours, no standby", cold, ours)
		}
		cw := timed("container + copy", func() (func(), error) {
			id, err := containerWithCopy(ctx, s, repo)
			return func() {
				if id != "" {
					_ = s.st.Docker.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true, RemoveVolumes: true})
				}
			}, err
		})
		gw := timed("git worktree add", func() (func(), error) {
			return GitWorktree(repo, filepath.Join(s.o.WorkDir, fmt.Sprintf("wt-f-%d", r.files)))
		})
		// Several agents: the sandbox is created once and each agent gets
		// a session; a container-per-agent tool pays a container + copy
		// per agent.
		n5 := max(1, int(math.Round(2*s.o.Scale)))
		ow5 := timedN(n5, "ours: create + sessions", settle, func() (func(), error) {
			id, err := s.st.CreateSandboxOnly(ctx, s.o.Image, repo)
			cleanup := func() {
				if id != "" {
					s.st.DestroySandbox(id)
				}
			}
			for i := 0; err == nil && i < agents; i++ {
				_, err = s.st.Session(ctx, id, fmt.Sprintf("agent-%d", i))
			}
			return cleanup, err
		})
		cw5 := timedN(n5, "containers + copies", settle, func() (func(), error) {
			var ids []string
			cleanup := func() {
				for _, id := range ids {
					_ = s.st.Docker.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true, RemoveVolumes: true})
				}
			}
			for i := 0; i < agents; i++ {
				id, err := containerWithCopy(ctx, s, repo)
				if id != "" {
					ids = append(ids, id)
				}
				if err != nil {
					return cleanup, err
				}
			}
			return cleanup, nil
		})
		o5 := s.summary("f", "ours: create + sessions", r.name, 0, ow5)
		c5 := s.summary("f", "containers + copies", r.name, 0, cw5)
		t5.Rows = append(t5.Rows, []string{r.name, fms(o5.P50), samplesCell(o5), fms(c5.P50), samplesCell(c5), ratio(c5.P50, o5.P50)})
		s.faster(fmt.Sprintf("%d agents: sandbox create + sessions, %s", agents, r.name), o5.P50, c5.P50,
			fmt.Sprintf("%d containers + copies", agents), 4)
		o := s.summary("f", "ours", r.name, 0, ow)
		c := s.summary("f", "container + copy", r.name, 0, cw)
		g := s.summary("f", "git worktree add", r.name, 0, gw)
		s.faster("sandbox create, "+r.name, o.P50, c.P50, "container + copy", 1)
		coldCell := "–"
		if owCold > 0 {
			oc := s.summary("f", "ours, no standby", r.name, 0, owCold)
			s.faster("sandbox create without a standby (the first of its image), "+r.name, oc.P50, c.P50, "container + copy", 1)
			coldCell = fms(oc.P50)
		}
		t.Rows = append(t.Rows, []string{r.name, fms(o.P50), fms(o.Max), samplesCell(o), coldCell, fms(c.P50), fms(c.Max), samplesCell(c),
			fms(g.P50), samplesCell(g), ratio(c.P50, o.P50)})
	}
	return Section{Intro: "`create_sandbox` through the gateway until the sandbox is ready: the durable creation saga (image " +
		"check, state volume, container with the daemon, workspace copy, start, readiness, base import of the git-tracked files " +
		"into the layer store). By default the gateway keeps a standby: after a create it starts one empty sandbox of the " +
		"image (network, volume, container, daemon), and the next create claims it and pays only the import; each timed create " +
		"here finds the standby made, as a user's does when creates are more than a couple of seconds apart. The column " +
		"without a standby drops the image's standby first: the first create of an image, which claims the gateway's spare " +
		"(a standby of no image: its network and state volume, made ahead for any image) and makes the container from there. The container-per-agent column is the same work a peer does for one agent: create a container " +
		"of the image, copy the repository in (Engine API, a tar stream of the tree) and start it. Our sandbox then serves " +
		"any number of agents; a container per agent pays this per agent. Latencies in ms. The second table is what " +
		"a team of agents pays in total: one sandbox and a session per agent, against a container + copy per agent.", Tables: []Table{t, t5}}, nil
}

// containerWithCopy creates a container of the image, copies repo into it
// and starts it; the caller removes it.
func containerWithCopy(ctx context.Context, s *Suite, repo string) (string, error) {
	dc := s.st.Docker
	created, err := dc.ContainerCreate(ctx, &container.Config{Image: s.o.Image, Cmd: []string{"sleep", "86400"}, WorkingDir: "/workspace",
		Labels: map[string]string{"eos.bench": "1"}}, &container.HostConfig{}, nil, nil, "")
	if err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarTree(pw, repo, "workspace")) }()
	if err := dc.CopyToContainer(ctx, created.ID, "/", pr, container.CopyToContainerOptions{}); err != nil {
		return created.ID, err
	}
	return created.ID, dc.ContainerStart(ctx, created.ID, container.StartOptions{})
}

// tarTree writes dir as a tar stream with every name under prefix.
func tarTree(w io.Writer, dir, prefix string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		name := filepath.ToSlash(filepath.Join(prefix, rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = name
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
