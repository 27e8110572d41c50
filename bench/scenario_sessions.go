package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/docker/docker/api/types/container"
)

// sessionLevels are the session counts of scenario (g); the baseline (a
// container per agent) runs up to maxBaselineContainers of them.
var sessionLevels = []int{10, 50, 200}

const maxBaselineContainers = 50

// sessionsLevel is what one level of (g) measured.
type sessionsLevel struct {
	n                   int
	create, exec        Summary
	memPerSession       int64 // (sandbox memory with n idle sessions - without any) / n
	baseCreate, baseRun Summary
	baseMem             int64 // mean memory of one idle baseline container
	baseline            bool
}

// runSessions: one sandbox grows to 10, 50 and 200 idle sessions; at each
// level the latency of creating the sessions of that step, the sandbox's
// memory per idle session, and exec latency (c = 1, round-robin over the
// sessions) — beside a container per agent (docker run -d, docker exec,
// each container's memory) up to 50 containers.
func runSessions(ctx context.Context, s *Suite) (Section, error) {
	_, id, destroy, err := s.repoSandbox(ctx, "repo-1k", 1000)
	if err != nil {
		return Section{}, err
	}
	defer destroy()
	SettleDisk()
	mem0, err := s.idleMemory(ctx, id)
	if err != nil {
		return Section{}, err
	}
	var sessions []string
	var bases []*Baseline
	defer func() {
		for _, b := range bases {
			b.Close()
		}
	}()
	var levels []sessionsLevel
	for _, n := range sessionLevels {
		lv := sessionsLevel{n: n}
		cas := fmt.Sprint(n)
		add := n - len(sessions)
		var created []string
		cw := loadNoWarmup(s.Rec, "g", cas, "create_session", add, func(i int) error {
			ws, err := s.st.Session(ctx, id, fmt.Sprintf("idle-%d", len(sessions)+i))
			if err == nil {
				created = append(created, ws)
			}
			return err
		})
		sessions = append(sessions, created...)
		lv.create = s.summary("g", cas, "create_session", 0, cw)
		if len(sessions) < n {
			return Section{}, fmt.Errorf("%d sessions: only %d created", n, len(sessions))
		}
		SettleDisk()
		mem, err := s.idleMemory(ctx, id)
		if err != nil {
			return Section{}, err
		}
		lv.memPerSession = (int64(mem) - int64(mem0)) / int64(n)
		ew := Load(s.Rec, "g", cas, "exec", 1, s.n(200), func(_, i int) error {
			return s.st.Exec(ctx, id, sessions[(i+len(sessions))%len(sessions)], "true")
		})
		lv.exec = s.summary("g", cas, "exec", 1, ew)

		if n <= maxBaselineContainers {
			lv.baseline = true
			bw := loadNoWarmup(s.Rec, "g", cas, "docker run -d", n-len(bases), func(int) error {
				b, err := StartBaseline(ctx, s.st.Docker, s.o.Image)
				if err == nil {
					bases = append(bases, b)
				}
				return err
			})
			lv.baseCreate = s.summary("g", cas, "docker run -d", 0, bw)
			xw := Load(s.Rec, "g", cas, "docker exec", 1, s.n(60), func(_, i int) error {
				_, err := DockerExec(ctx, s.st.Docker, bases[(i+len(bases))%len(bases)].ID, []string{"true"}, nil)
				return err
			})
			lv.baseRun = s.summary("g", cas, "docker exec", 1, xw)
			lv.baseMem = s.containersMemory(ctx, bases)
		}
		levels = append(levels, lv)
	}

	t := Table{Header: []string{"sessions", "create p50", "p99", "exec p50", "exec p99", "exec p99 / p50 at 10",
		"memory per idle session", "docker run -d p50", "docker exec p50", "docker exec p99", "memory per idle container",
		"create ratio", "exec p99 ratio", "memory ratio"}}
	pc := Plot{File: "sessions-create.png", Title: "Session create against sessions in the sandbox (p50)", XLabel: "sessions",
		YLabel: "latency (ms)", LogX: true, LogY: true}
	px := Plot{File: "sessions-exec.png", Title: "exec p99 against sessions in the sandbox", XLabel: "sessions",
		YLabel: "latency (ms)", LogX: true, LogY: true}
	pm := Plot{File: "sessions-memory.png", Title: "Memory per idle session against sessions in the sandbox", XLabel: "sessions",
		YLabel: "KiB", LogX: true, LogY: true}
	series := map[string]*Series{}
	point := func(name string, x int, y float64) {
		if series[name] == nil {
			series[name] = &Series{Name: name}
		}
		series[name].X, series[name].Y = append(series[name].X, float64(x)), append(series[name].Y, y)
	}
	base50 := levels[0].exec.P50
	for _, lv := range levels {
		row := []string{fmt.Sprint(lv.n), fms(lv.create.P50), fms(lv.create.P99), fms(lv.exec.P50), fms(lv.exec.P99),
			fmt.Sprintf("%.1fx", float64(lv.exec.P99)/float64(base50)), bytesStr(lv.memPerSession)}
		point("ours: create_workspace_session", lv.n, Ms(lv.create.P50))
		point("ours: exec p99", lv.n, Ms(lv.exec.P99))
		point("ours: per idle session", lv.n, float64(lv.memPerSession)/1024)
		if lv.baseline {
			row = append(row, fms(lv.baseCreate.P50), fms(lv.baseRun.P50), fms(lv.baseRun.P99), bytesStr(lv.baseMem),
				ratio(lv.baseCreate.P50, lv.create.P50), ratio(lv.baseRun.P99, lv.exec.P99),
				fmt.Sprintf("%.1fx", float64(lv.baseMem)/float64(max(lv.memPerSession, 1))))
			point("docker run -d", lv.n, Ms(lv.baseCreate.P50))
			point("docker exec p99", lv.n, Ms(lv.baseRun.P99))
			point("per idle container", lv.n, float64(lv.baseMem)/1024)
		} else {
			row = append(row, "–", "–", "–", "–", "–", "–", "–")
		}
		t.Rows = append(t.Rows, row)
	}
	if top := levels[len(levels)-1]; top.memPerSession > 0 {
		base := "–"
		for _, lv := range levels {
			if lv.baseline {
				base = "an idle container's cgroup " + bytesStr(lv.baseMem)
			}
		}
		s.target(Target{Measure: fmt.Sprintf("memory per idle session, %d sessions in the sandbox", top.n), Ours: bytesStr(top.memPerSession),
			Baseline: base, Ratio: "–", Goal: "≤ 1 MiB", Met: top.memPerSession <= 1<<20})
	}
	for _, p := range []struct {
		plot  *Plot
		names []string
	}{
		{&pc, []string{"ours: create_workspace_session", "docker run -d"}},
		{&px, []string{"ours: exec p99", "docker exec p99"}},
		{&pm, []string{"ours: per idle session", "per idle container"}},
	} {
		for _, name := range p.names {
			if series[name] != nil {
				p.plot.Series = append(p.plot.Series, *series[name])
			}
		}
		s.Plots = append(s.Plots, *p.plot)
	}
	return Section{Intro: fmt.Sprintf("One sandbox over the 1k-file repository grows to %v idle workspace sessions "+
		"(`create_workspace_session`, durable, one after another). At each level: the latency of the creates of that step, the "+
		"sandbox container's memory (Docker's figure: the cgroup's usage without the page cache; median of 3 samples after the "+
		"disk settled) above the sandbox without sessions, divided by the sessions, and `exec_command` of `true` at c = 1 "+
		"round-robin over all sessions. Baseline, in the same run up to %d: a container per agent (`docker run -d` of the image "+
		"with `sleep`), `docker exec` round-robin over them, and the mean memory of one idle container. Ratios: the baseline's "+
		"figure over ours (above 1: we are cheaper).", sessionLevels, maxBaselineContainers),
		Tables: []Table{t}}, nil
}

// loadNoWarmup runs n operations one after another and records each; the
// operations change state (a session more), so there is no warm-up run.
func loadNoWarmup(rec *Recorder, scenario, cas, op string, n int, fn func(i int) error) time.Duration {
	start := time.Now()
	for i := 0; i < n; i++ {
		t := time.Now()
		err := fn(i)
		rec.Add(Sample{Scenario: scenario, Case: cas, Op: op, Concurrency: 1, Latency: time.Since(t), Err: err != nil})
	}
	return time.Since(start)
}

// idleMemory is the median of three samples of the sandbox's memory, one
// second apart.
func (s *Suite) idleMemory(ctx context.Context, id string) (uint64, error) {
	var v []uint64
	for i := 0; i < 3; i++ {
		time.Sleep(time.Second)
		u, err := s.st.Acts.Usage(ctx, id)
		if err != nil {
			return 0, err
		}
		v = append(v, u.MemoryCurrentBytes)
	}
	slices.Sort(v)
	return v[1], nil
}

// containersMemory is the mean memory (usage without page cache) of the
// baseline containers.
func (s *Suite) containersMemory(ctx context.Context, bases []*Baseline) int64 {
	var vals []int64
	for _, b := range bases {
		r, err := s.st.Docker.ContainerStatsOneShot(ctx, b.ID)
		if err != nil {
			continue
		}
		var st container.StatsResponse
		err = json.NewDecoder(r.Body).Decode(&st)
		r.Body.Close()
		if err != nil {
			continue
		}
		use := int64(st.MemoryStats.Usage)
		for _, k := range []string{"total_inactive_file", "inactive_file"} {
			if c, ok := st.MemoryStats.Stats[k]; ok && int64(c) < use {
				use -= int64(c)
				break
			}
		}
		vals = append(vals, use)
	}
	if len(vals) == 0 {
		return -1
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	var sum int64
	for _, v := range vals {
		sum += v
	}
	return sum / int64(len(vals))
}
