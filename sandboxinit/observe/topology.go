package observe

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// maxTopologyProcesses bounds one /proc walk (all workspaces together).
const maxTopologyProcesses = 2048

// topoProcess is one process of a workspace (the seed's cgroup.topology).
type topoProcess struct {
	PID                 int      `json:"pid"`
	NamespacePID        int      `json:"namespace_pid"`
	ParentPID           int      `json:"parent_pid"`
	Name                string   `json:"name"`
	State               string   `json:"state"`
	Kind                string   `json:"kind"` // namespace_init or process
	CgroupMemberships   []string `json:"cgroup_memberships"`
	ResidentMemoryBytes int64    `json:"resident_memory_bytes"`
	CPUTimeUsec         int64    `json:"cpu_time_us"`
	StartTimeTicks      uint64   `json:"start_time_ticks"`
}

type topoWorkspace struct {
	WorkspaceID    string        `json:"workspace_id"`
	State          string        `json:"state"` // active, idle or partial
	HolderPID      int           `json:"holder_pid"`
	PidNamespace   string        `json:"pid_namespace"`
	MountNamespace string        `json:"mount_namespace"`
	Processes      []topoProcess `json:"processes"`
}

type topology struct {
	SchemaVersion int             `json:"schema_version"`
	Available     bool            `json:"available"`
	Source        *string         `json:"source"`
	Error         *string         `json:"error"`
	Truncated     bool            `json:"truncated"`
	Warnings      []string        `json:"warnings"`
	Workspaces    []topoWorkspace `json:"workspaces"`
}

// topology walks /proc once for the processes of every live session (or
// only of workspace only), at most maxTopologyProcesses in all. Sessions'
// pids come from their cgroups, so nothing else in the sandbox is read.
func (o *Observer) topology(only string) topology {
	src := "proc_namespaces"
	t := topology{SchemaVersion: 2, Available: true, Source: &src, Warnings: []string{}, Workspaces: []topoWorkspace{}}
	if _, err := os.Stat("/proc/self/ns/pid"); err != nil {
		msg := fmt.Sprintf("no /proc namespaces: %v", err)
		t.Available, t.Source, t.Error = false, nil, &msg
		return t
	}
	sessions := o.src.Sessions()
	// Sorted by id (the seed's order), which is also the order the process
	// budget is spent in.
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].ID < sessions[j].ID })
	budget := maxTopologyProcesses
	for _, s := range sessions {
		if only != "" && s.ID != only {
			continue
		}
		w := topoWorkspace{WorkspaceID: s.ID, State: "idle", Processes: []topoProcess{}}
		if len(o.Running.List(s.ID)) > 0 {
			w.State = "active"
		}
		rs := s.Runtime
		if rs == nil {
			w.State = "partial"
			t.Warnings = append(t.Warnings, s.ID+": session is not running")
			t.Workspaces = append(t.Workspaces, w)
			continue
		}
		partial := false
		if pid, err := rs.InitPid(); err == nil {
			w.HolderPID = pid
			w.PidNamespace, w.MountNamespace = nsOf(pid, "pid"), nsOf(pid, "mnt")
		} else {
			partial = true
			t.Warnings = append(t.Warnings, fmt.Sprintf("%s: holder: %v", s.ID, err))
		}
		pids, err := rs.Pids()
		if err != nil {
			partial = true
			t.Warnings = append(t.Warnings, fmt.Sprintf("%s: processes: %v", s.ID, err))
		}
		sort.Ints(pids)
		for _, pid := range pids {
			if budget == 0 {
				t.Truncated, partial = true, true
				break
			}
			budget--
			p, err := readTopoProcess(pid)
			if err != nil {
				continue // it exited meanwhile
			}
			w.Processes = append(w.Processes, p)
		}
		if partial {
			w.State = "partial"
		}
		t.Workspaces = append(t.Workspaces, w)
	}
	return t
}

func readTopoProcess(pid int) (topoProcess, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return topoProcess{}, err
	}
	st, err := p.Stat()
	if err != nil {
		return topoProcess{}, err
	}
	out := topoProcess{PID: pid, NamespacePID: pid, ParentPID: st.PPID, Name: st.Comm, State: st.State, Kind: "process",
		ResidentMemoryBytes: int64(st.ResidentMemory()), CPUTimeUsec: int64(st.CPUTime() * 1e6), StartTimeTicks: st.Starttime,
		CgroupMemberships: []string{}}
	if status, err := p.NewStatus(); err == nil && len(status.NSpids) > 0 {
		out.NamespacePID = int(status.NSpids[len(status.NSpids)-1])
	}
	if out.NamespacePID == 1 {
		out.Kind = "namespace_init"
	}
	if cgs, err := p.Cgroups(); err == nil {
		for _, c := range cgs {
			out.CgroupMemberships = append(out.CgroupMemberships, strconv.Itoa(c.HierarchyID)+":"+strings.Join(c.Controllers, ",")+":"+c.Path)
		}
	}
	return out, nil
}

// nsOf returns a process's namespace of kind as "pid:[4026531836]".
func nsOf(pid int, kind string) string {
	s, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + kind)
	if err != nil {
		return ""
	}
	return s
}

// ownNamespaces counts the namespaces of pid that differ from the
// daemon's: what the session holds of its own (mnt, pid, ipc, uts, and net
// when isolated).
func ownNamespaces(pid int) int {
	n := 0
	for _, k := range []string{"mnt", "pid", "ipc", "uts", "net", "cgroup", "user", "time"} {
		if ns := nsOf(pid, k); ns != "" && ns != nsOf(os.Getpid(), k) {
			n++
		}
	}
	return n
}
