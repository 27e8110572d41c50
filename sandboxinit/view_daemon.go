package sandboxinit

import (
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"
)

func selfPID() int { return os.Getpid() }

// daemonView is the daemon's own diagnostics: process, Go runtime, what it
// owns, and its observability store with drop counters.
func (d *Daemon) daemonView() map[string]any {
	p := selfProcess()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	proc := map[string]any{"pid": p.pid, "rss_bytes": p.rss, "cpu_time_us": p.cpuUsec, "threads": p.threads, "fds": p.fds,
		"uptime_seconds": int64(time.Since(d.started).Seconds()), "started_at": d.started.UTC()}
	if p.err != "" {
		proc["error"] = p.err
	}
	var sample any // the newest sandbox sample, null while none was taken in the last minute
	if latest, _, err := d.latestSamples(); err == nil && latest["sandbox"] != nil {
		sample = latest["sandbox"]
	}
	running := d.obs.execs.count()
	sessions := d.liveSessions()
	return map[string]any{"view": "daemon", "scope": "sandbox", "daemon": map[string]any{
		"process": proc,
		"runtime": map[string]any{"go_version": goruntime.Version(), "goroutines": goruntime.NumGoroutine(), "gomaxprocs": goruntime.GOMAXPROCS(0),
			"num_cpu": goruntime.NumCPU(), "heap_alloc_bytes": ms.HeapAlloc, "heap_inuse_bytes": ms.HeapInuse, "heap_sys_bytes": ms.HeapSys,
			"sys_bytes": ms.Sys, "gc_cycles": ms.NumGC},
		"ownership": map[string]any{"state_dir": d.cfg.StateDir, "layerstack_root": d.store.Root(), "runtime_dir": filepath.Join(d.cfg.StateDir, "runtime"),
			"workspace_sessions": len(sessions), "running_commands": running, "leases": len(d.store.Leases()), "listen": d.cfg.Listen},
		"event_store": d.eventStore(),
		"sampler":     d.obs.sampler.Stats(),
		"sample":      sample,
	}}
}
