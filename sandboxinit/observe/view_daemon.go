package observe

import (
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/ephemeral-sandbox/sandbox/internal/spreaddir"
)

func selfPID() int { return os.Getpid() }

// spreadDirs says, of each directory the daemon makes and removes
// subdirectories in all day, whether they are spread over the file
// system's groups (spreaddir; false on a file system other than ext4).
func (o *Observer) spreadDirs(store string) map[string]bool {
	out := map[string]bool{}
	for _, d := range []string{filepath.Join(o.cfg.StateDir, "sessions"), filepath.Join(o.cfg.StateDir, "runtime"), filepath.Join(o.cfg.StateDir, "txns"),
		filepath.Join(store, "staging"), filepath.Join(store, "base")} {
		rel, err := filepath.Rel(o.cfg.StateDir, d)
		if err != nil {
			rel = d
		}
		out[rel], _ = spreaddir.Spreads(d)
	}
	return out
}

// daemonView is the daemon's own diagnostics: process, Go runtime, what it
// owns, and its observability store with drop counters.
func (o *Observer) DaemonView() map[string]any {
	p := selfProcess()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	proc := map[string]any{"pid": p.pid, "rss_bytes": p.rss, "cpu_time_us": p.cpuUsec, "threads": p.threads, "fds": p.fds,
		"uptime_seconds": int64(time.Since(o.cfg.Started).Seconds()), "started_at": o.cfg.Started.UTC()}
	if p.err != "" {
		proc["error"] = p.err
	}
	var sample any // the newest sandbox sample, null while none was taken in the last minute
	if latest, _, err := o.latestSamples(); err == nil && latest["sandbox"] != nil {
		sample = latest["sandbox"]
	}
	running := o.Running.Count()
	sessions := o.src.Sessions()
	layers := o.src.Layers()
	var warm any // the warm session (a daemon that has one)
	if ws, ok := o.src.(interface{ WarmStats() map[string]any }); ok {
		warm = ws.WarmStats()
	}
	var requests any // the requests being served (this view's own among them)
	if rs, ok := o.src.(interface{ Requests() map[string]any }); ok {
		requests = rs.Requests()
	}
	return map[string]any{"view": "daemon", "scope": "sandbox", "daemon": map[string]any{
		"warm_session":  warm,
		"requests":      requests,
		"ingress_guard": o.cfg.IngressGuard,
		"process":       proc,
		"runtime": map[string]any{"go_version": goruntime.Version(), "goroutines": goruntime.NumGoroutine(), "gomaxprocs": goruntime.GOMAXPROCS(0),
			"num_cpu": goruntime.NumCPU(), "heap_alloc_bytes": ms.HeapAlloc, "heap_inuse_bytes": ms.HeapInuse, "heap_sys_bytes": ms.HeapSys,
			"sys_bytes": ms.Sys, "gc_cycles": ms.NumGC},
		"ownership": map[string]any{"state_dir": o.cfg.StateDir, "layerstack_root": layers.Root(), "runtime_dir": filepath.Join(o.cfg.StateDir, "runtime"),
			"workspace_sessions": len(sessions), "running_commands": running, "leases": len(layers.Leases()), "listen": o.cfg.Listen,
			"spread_dirs": o.spreadDirs(layers.Root())},
		"event_store": o.eventStore(),
		"sampler":     o.Sampler.Stats(),
		"sample":      sample,
	}}
}
