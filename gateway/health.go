package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// HealthChecker is an optional Backend extension: the health of what the
// gateway depends on (Temporal, Docker, each sandbox's daemon).
type HealthChecker interface {
	// Health reports each dependency; critical is false when the gateway
	// cannot serve lifecycle operations at all (Temporal is down).
	Health(ctx context.Context) (report map[string]any, critical bool)
}

// healthTimeout bounds a whole /healthz report.
const healthTimeout = 5 * time.Second

// serveHealth serves GET /healthz. Without the token it says only that the
// gateway is up (for load balancers and scripts); with it, the full report:
// Temporal, Docker and each sandbox's daemon. Status ok, degraded (a
// sandbox or Docker is unwell) or down (Temporal is unreachable: 503).
func (s *Server) serveHealth(c *gin.Context) {
	base := gin.H{"status": "ok", "service": "sandbox-gateway"}
	tok, _ := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	hc, ok := s.Backend.(HealthChecker)
	if !ok || !s.authorized(strings.TrimSpace(tok)) {
		c.JSON(http.StatusOK, base)
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), healthTimeout)
	defer cancel()
	rep, critical := hc.Health(ctx)
	for k, v := range rep {
		base[k] = v
	}
	status := http.StatusOK
	switch {
	case !critical:
		base["status"], status = "down", http.StatusServiceUnavailable
	case degraded(rep):
		base["status"] = "degraded"
	}
	c.JSON(status, base)
}

// degraded: Docker is down, the fleet could not be listed, or a ready
// sandbox's daemon does not answer (one still being created is not a fault).
func degraded(rep map[string]any) bool {
	for _, k := range []string{"temporal", "docker"} {
		if m, ok := rep[k].(map[string]any); ok && m["status"] != "ok" && m["status"] != "not_used" {
			return true
		}
	}
	if _, failed := rep["sandboxes_error"]; failed {
		return true
	}
	sbs, _ := rep["sandboxes"].([]map[string]any)
	for _, sb := range sbs {
		if sb["daemon"] == "unavailable" {
			return true
		}
	}
	return false
}

func check(start time.Time, err error, extra map[string]any) map[string]any {
	m := map[string]any{"status": "ok", "latency_ms": float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		m["status"], m["error"] = "unavailable", api.AsError(err).Message
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// Health implements HealthChecker.
func (b *TemporalBackend) Health(ctx context.Context) (map[string]any, bool) {
	rep := map[string]any{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	set := func(k string, v any) { mu.Lock(); rep[k] = v; mu.Unlock() }
	wg.Add(2)
	go func() {
		defer wg.Done()
		start := time.Now()
		_, err := b.Client.CheckHealth(ctx, nil)
		set("temporal", check(start, err, map[string]any{"namespace": b.namespace()}))
	}()
	go func() {
		defer wg.Done()
		// Docker is the host worker's to reach: asked through it, briefly.
		// In a cluster, each registered host's (a lost one is not asked).
		start := time.Now()
		hctx, cancel := context.WithTimeout(ctx, healthHostTimeout)
		defer cancel()
		var hosts []workflows.HostInfo
		if b.LocalQueue == "" {
			hosts, _ = b.hosts(hctx)
		}
		if len(hosts) == 0 {
			v, err := b.runHostOp(hctx, workflows.HostOp{Op: workflows.HostOpVersion})
			version := ""
			if err == nil {
				version = v.Version
			}
			set("docker", check(start, err, map[string]any{"version": version, "via": "host worker"}))
			return
		}
		nodes := make([]map[string]any, len(hosts))
		var hw sync.WaitGroup
		for i, h := range hosts {
			hw.Add(1)
			go func() {
				defer hw.Done()
				hstart := time.Now()
				var err error
				version := ""
				if !h.Live(time.Now()) {
					err = hostLost("", h)
				} else if v, verr := b.runHostOp(hctx, workflows.HostOp{Op: workflows.HostOpVersion, Queue: h.Queue}); verr != nil {
					err = verr
				} else {
					version = v.Version
				}
				nodes[i] = check(hstart, err, map[string]any{"host": h.Name, "version": version, "sandboxes": h.Sandboxes,
					"last_seen": h.LastSeen.UTC().Format(time.RFC3339)})
			}()
		}
		hw.Wait()
		var err error
		for _, n := range nodes {
			if n["status"] != "ok" {
				err = api.Errorf(api.KindOperationFailed, nil, "host %v: %v", n["host"], n["error"])
				break
			}
		}
		set("docker", check(start, err, map[string]any{"via": "host workers", "hosts": nodes}))
	}()
	wg.Wait()
	if t, _ := rep["temporal"].(map[string]any); t["status"] != "ok" {
		return rep, false
	}
	sbs := []map[string]any{}
	if fleet, err := b.fleet(ctx); err != nil {
		rep["sandboxes_error"] = api.AsError(err).Message
	} else {
		sbs = make([]map[string]any, len(fleet))
		idx := map[string]int{}
		for i, f := range fleet {
			idx[f.ID] = i
		}
		b.each(ctx, fleet, func(ctx context.Context, f *fleetEntry) {
			node := map[string]any{"sandbox_id": f.ID, "state": "unknown", "daemon": "unavailable"}
			switch {
			case f.Err != nil:
				node["error"] = f.Err.Error()
			case f.State.Phase != workflows.PhaseReady:
				node["state"], node["daemon"] = f.State.Phase, "not_ready"
			default:
				node["state"] = f.State.Phase
				start := time.Now()
				_, err := b.callDaemon(ctx, f.ID, f.State.Container.Daemon, "health", []byte("{}"), nil)
				for k, v := range check(start, err, nil) {
					if k == "status" {
						k = "daemon"
					}
					node[k] = v
				}
				if err == nil {
					node["daemon"] = "ok"
				}
			}
			sbs[idx[f.ID]] = node
		})
	}
	rep["sandboxes"] = sbs
	if b.Standby.Enabled {
		// The started, empty sandboxes the next creates will claim.
		rep["standby_sandboxes"] = b.Standbys(ctx)
	}
	return rep, true
}

func (b *TemporalBackend) namespace() string {
	if b.Namespace == "" {
		return "default"
	}
	return b.Namespace
}
