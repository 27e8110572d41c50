package observe

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// maxUpperWalk bounds the entries one upper-dir measurement visits, so a
// session holding a huge install cannot make sampling expensive.
const maxUpperWalk = 20000

// collect is one sampler round: the sandbox, every live session, and the
// layer stack when its manifest changed. It runs on the sampler's
// goroutine, only while the sandbox is active.
func (o *Observer) collect(now time.Time) {
	now = now.UTC()
	samples := o.Store.Samples
	add := func(scope string, m map[string]any) {
		telemetry.Record(context.Background(), samples, &telemetry.Sample{TS: now, Scope: scope, Metrics: m})
	}
	add("sandbox", o.sandboxMetrics(now))
	for _, s := range o.src.Sessions() {
		add(s.ID, o.sessionMetrics(s, now))
	}
	if m := o.stackMetrics(); m != nil {
		add("stack", m)
	}
}

// sandboxMetrics samples the container's cgroup and the daemon process.
func (o *Observer) sandboxMetrics(now time.Time) map[string]any {
	m := map[string]any{}
	var errs []string
	if paths, err := runtime.SandboxCgroupPaths(); err != nil {
		errs = append(errs, err.Error())
	} else {
		u, err := runtime.ReadCgroupUsage(paths)
		if err != nil {
			errs = append(errs, err.Error())
		}
		cgroupMetrics(m, u)
		m["cpu_percent"] = o.cpuPercent("sandbox", now, u.CPUUsageUsec)
	}
	p := selfProcess()
	for k, v := range p.metrics("daemon_") {
		m[k] = v
	}
	if p.err != "" {
		errs = append(errs, p.err)
	}
	m["daemon_goroutines"] = goruntime.NumGoroutine()
	m["running_commands"] = o.Running.Count()
	if len(errs) > 0 {
		m["errors"] = errs
	}
	return m
}

// sessionMetrics samples one session's cgroup and upper dir.
func (o *Observer) sessionMetrics(s Session, now time.Time) map[string]any {
	m := map[string]any{"lifecycle_state": s.State}
	var errs []string
	if rs := s.Runtime; rs != nil {
		paths, err := rs.CgroupPaths()
		if err == nil {
			var u runtime.CgroupUsage
			u, err = runtime.ReadCgroupUsage(paths)
			cgroupMetrics(m, u)
			m["cpu_percent"] = o.cpuPercent(s.ID, now, u.CPUUsageUsec)
		}
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	bytes, entries, complete := upperBytes(s.Upper)
	m["upper_bytes"], m["upper_entries"] = bytes, entries
	if !complete {
		m["upper_bytes_partial"] = true
	}
	m["running_commands"] = len(o.Running.List(s.ID))
	if len(errs) > 0 {
		m["errors"] = errs
	}
	return m
}

func cgroupMetrics(m map[string]any, u runtime.CgroupUsage) {
	m["cpu_usage_usec"], m["memory_bytes"], m["pids"] = u.CPUUsageUsec, u.MemoryBytes, u.Pids
	m["io_read_bytes"], m["io_write_bytes"] = u.IOReadBytes, u.IOWriteBytes
	if u.MemoryLimitBytes > 0 {
		m["memory_limit_bytes"] = u.MemoryLimitBytes
	}
	if u.PidsLimit > 0 {
		m["pids_limit"] = u.PidsLimit
	}
}

// cpuPercent turns a cumulative CPU counter into the share of one CPU used
// since the scope's previous sample (0 on the first).
func (o *Observer) cpuPercent(scope string, now time.Time, usec uint64) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	prev, ok := o.prevCPU[scope]
	o.prevCPU[scope] = cpuPoint{at: now, usec: usec}
	if len(o.prevCPU) > 4096 { // sessions come and go: forget them all now and then
		o.prevCPU = map[string]cpuPoint{scope: {at: now, usec: usec}}
	}
	dt := now.Sub(prev.at).Microseconds()
	if !ok || dt <= 0 || usec < prev.usec {
		return 0
	}
	return float64(int64(usec-prev.usec)*10000/dt) / 100
}

// stackMetrics describes the layer stack, but only when its manifest
// changed since the last stack sample (the stack trend needs no more).
func (o *Observer) stackMetrics() map[string]any {
	man, err := o.src.Layers().Manifest()
	if err != nil {
		return nil
	}
	o.mu.Lock()
	seen := o.stackSeen
	o.stackSeen = man.Version
	o.mu.Unlock()
	if seen == man.Version {
		return nil
	}
	st := o.stackSummary(man)
	return map[string]any{"manifest_version": man.Version, "layer_count": st.LayerCount, "layers_bytes": st.LayersBytes,
		"layers_allocated_bytes": st.LayersAllocatedBytes, "storage_allocated_bytes": st.StorageAllocatedBytes,
		"active_leases": st.ActiveLeases}
}

// upperBytes is the logical size of an upper dir, visiting at most
// maxUpperWalk entries (complete reports whether it saw them all).
func upperBytes(dir string) (bytes int64, entries int, complete bool) {
	stop := errors.New("enough")
	err := filepath.WalkDir(dir, func(_ string, de fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if entries++; entries > maxUpperWalk {
			return stop
		}
		if de.Type().IsRegular() {
			if fi, err := de.Info(); err == nil {
				bytes += fi.Size()
			}
		}
		return nil
	})
	return bytes, entries - 1, !errors.Is(err, stop)
}

// process is a /proc sample of one process.
type process struct {
	pid       int
	rss       int64
	cpuUsec   int64
	threads   int
	fds       int
	startTick uint64
	err       string
}

func selfProcess() process {
	p, err := procfs.Self()
	if err != nil {
		return process{pid: os.Getpid(), err: err.Error()}
	}
	return readProcess(p)
}

func readProcess(p procfs.Proc) process {
	out := process{pid: p.PID}
	st, err := p.Stat()
	if err != nil {
		out.err = err.Error()
		return out
	}
	out.rss = int64(st.ResidentMemory())
	out.cpuUsec = int64(st.CPUTime() * 1e6)
	out.threads = st.NumThreads
	out.startTick = st.Starttime
	if n, err := p.FileDescriptorsLen(); err == nil {
		out.fds = n
	}
	return out
}

func (p process) metrics(prefix string) map[string]any {
	return map[string]any{prefix + "pid": p.pid, prefix + "rss_bytes": p.rss, prefix + "cpu_usec": p.cpuUsec,
		prefix + "threads": p.threads, prefix + "fds": p.fds}
}
