package runtime

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
)

// CgroupUsage is what the collectors read from one cgroup.
type CgroupUsage struct {
	CPUUsageUsec     uint64 `json:"cpu_usage_usec"`
	MemoryBytes      uint64 `json:"memory_bytes"`
	MemoryLimitBytes uint64 `json:"memory_limit_bytes,omitempty"`
	Pids             uint64 `json:"pids"`
	PidsLimit        uint64 `json:"pids_limit,omitempty"`
	IOReadBytes      uint64 `json:"io_read_bytes"`
	IOWriteBytes     uint64 `json:"io_write_bytes"`
}

// ErrPartialStats means some controllers could not be read; the usage
// returned holds the others.
var ErrPartialStats = errors.New("cgroup stats are partial")

// statControllers are the v1 controllers the collectors read.
var statControllers = []string{"cpu", "cpuacct", "memory", "pids", "blkio"}

// ReadCgroupUsage reads CPU, memory, pids and block I/O of the cgroup at
// paths: controller to dir on v1, "" to the dir on v2, the form of
// Session.CgroupPaths. It only reads.
func ReadCgroupUsage(paths map[string]string) (CgroupUsage, error) {
	var u CgroupUsage
	sel := map[string]string{}
	if p, ok := paths[""]; ok {
		sel[""] = p
	} else {
		for _, c := range statControllers {
			if p, ok := paths[c]; ok {
				sel[c] = p
			}
		}
	}
	if len(sel) == 0 {
		return u, errors.New("cgroup stats: no cgroup paths")
	}
	m, err := manager.NewWithPaths(&cgroups.Cgroup{Resources: &cgroups.Resources{}}, sel)
	if err != nil {
		return u, fmt.Errorf("cgroup stats: %w", err)
	}
	// One controller at a time: a missing file of one (pids.current of a
	// root cgroup) must not hide the others.
	var errs []error
	st := cgroups.NewStats()
	for _, c := range []cgroups.Controller{cgroups.CPU, cgroups.Memory, cgroups.Pids, cgroups.IO} {
		s, err := m.Stats(&cgroups.StatsOptions{Controllers: c})
		if err != nil || s == nil {
			errs = append(errs, err)
			continue
		}
		switch c {
		case cgroups.CPU:
			st.CpuStats = s.CpuStats
		case cgroups.Memory:
			st.MemoryStats = s.MemoryStats
		case cgroups.Pids:
			st.PidsStats = s.PidsStats
		case cgroups.IO:
			st.BlkioStats = s.BlkioStats
		}
	}
	u.CPUUsageUsec = st.CpuStats.CpuUsage.TotalUsage / 1000
	u.MemoryBytes = st.MemoryStats.Usage.Usage
	if l := st.MemoryStats.Usage.Limit; l > 0 && l < 1<<62 {
		u.MemoryLimitBytes = l
	}
	u.Pids = st.PidsStats.Current
	if l := st.PidsStats.Limit; l > 0 && l < 1<<62 {
		u.PidsLimit = l
	}
	for _, e := range st.BlkioStats.IoServiceBytesRecursive {
		switch e.Op {
		case "Read", "read":
			u.IOReadBytes += e.Value
		case "Write", "write":
			u.IOWriteBytes += e.Value
		}
	}
	switch {
	case len(errs) == 4:
		return u, fmt.Errorf("cgroup stats: %w", errors.Join(errs...))
	case len(errs) > 0:
		return u, fmt.Errorf("%w: %w", ErrPartialStats, errors.Join(errs...))
	}
	return u, nil
}

// SandboxCgroupPaths returns the sandbox container's own cgroup: the
// daemon's cgroup on v1 (sessions are below it), the parent of the daemon's
// "daemon" leaf on v2.
func SandboxCgroupPaths() (map[string]string, error) {
	if cgroups.IsCgroup2UnifiedMode() {
		own, err := ownCgroupV2()
		if err != nil {
			return nil, err
		}
		if filepath.Base(own) == "daemon" {
			own = filepath.Dir(own)
		}
		return map[string]string{"": filepath.Join(cgroupRoot, own)}, nil
	}
	out := map[string]string{}
	var errs []error
	for _, c := range statControllers {
		p, err := cgroups.GetOwnCgroupPath(c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[c] = p
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sandbox cgroup: %w", errors.Join(errs...))
	}
	return out, nil
}
