// Command sandbox-gateway serves the operation catalog over HTTP (gin) and
// the seed's JSON-lines protocol on one listener (127.0.0.1:7878 by
// default). By default it also runs the embedded Temporal dev server and the
// lifecycle workers in-process; --no-workers makes it a client of a
// separate Temporal cluster and sandbox-workers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/config"
	"github.com/ephemeral-sandbox/sandbox/gateway"
	"github.com/ephemeral-sandbox/sandbox/worker"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

func main() { os.Exit(run()) }

func run() int {
	worker.TuneGC()
	var wf worker.Flags
	wf.Register(flag.CommandLine)
	var (
		listen     = flag.String("listen", gateway.DefaultAddr, "TCP address for HTTP and JSON lines")
		unixSock   = flag.String("unix-socket", "", "also listen on this unix socket (mode 0600)")
		tokenFile  = flag.String("token-file", client.TokenPath(), "gateway token file (created 0600 when missing)")
		noWorkers  = flag.Bool("no-workers", false, "run no workers in-process (a client of separate sandbox-workers)")
		uiURL      = flag.String("temporal-ui-url", "", "base URL of a Temporal UI for workflow links (a cluster's; default: the embedded UI when it is on)")
		cfgFile    = flag.String("config", os.Getenv(config.EnvVar), "the seed's gateway YAML (default $"+config.EnvVar+"); see README, Configuration from the seed's YAML")
		defTTL     = flag.String("default-sandbox-ttl", "", "pause sandboxes this long after creation or resume unless create_sandbox passes ttl (Go duration, e.g. 24h; 0 = off; default the config's lifecycle.default_sandbox_ttl, else off)")
		fleetTO    = flag.Duration("fleet-timeout", gateway.DefaultFleetTimeout, "how long the fleet views (snapshot and resources without a sandbox, /healthz) wait for each sandbox before listing it unavailable")
		defIdle    = flag.String("default-session-idle-ttl", "", "archive workspace sessions unused this long unless create_sandbox passes session_idle_ttl (e.g. 30m; 0 = off; default the config's lifecycle.default_session_idle_ttl, else off)")
		standby    = flag.Bool("standby", true, "after a create_sandbox, keep one started, empty sandbox of its image on its host for the next create_sandbox to claim (it then pays only the workspace import); removed unclaimed after --standby-ttl and at shutdown")
		standbyTTL = flag.Duration("standby-ttl", workflows.DefaultStandbyTTL, "how long an unclaimed standby sandbox waits before it removes itself")
	)
	flag.Parse()
	log := wf.Logger()
	cfg, err := config.Open(*cfgFile, log)
	if err != nil {
		log.Error("gateway config", "err", err)
		return 1
	}

	sandboxTTL, idleTTL := cfg.DefaultSandboxTTL, cfg.DefaultSessionIdleTTL
	if *defTTL != "" {
		d, perr := api.ParseTTL("--default-sandbox-ttl", *defTTL)
		if perr != nil {
			log.Error("flags", "err", perr.Message)
			return 2
		}
		sandboxTTL = d
	}
	if *defIdle != "" {
		d, perr := api.ParseTTL("--default-session-idle-ttl", *defIdle)
		if perr != nil {
			log.Error("flags", "err", perr.Message)
			return 2
		}
		idleTTL = d
	}

	token, err := client.EnsureToken(*tokenFile)
	if err != nil {
		log.Error("gateway token", "file", *tokenFile, "err", err)
		return 1
	}
	secret, err := wf.Secret()
	if err != nil {
		log.Error("gateway secret", "err", err)
		return 1
	}
	// The token file and the state dir are never a workspace nor an
	// export destination, nor inside or above one.
	hostPaths, err := wf.HostPaths(filepath.Dir(*tokenFile))
	if err != nil {
		log.Error("allowed roots (--allow-root)", "err", err)
		return 1
	}
	var acts *activities.Activities
	if !*noWorkers {
		if acts, err = worker.BuildActivities(secret, wf.DaemonBin, wf.Seccomp, hostPaths, log); err != nil {
			log.Error("worker setup", "err", err)
			return 1
		}
		activities.SetDaemonArgs(acts, cfg.DaemonArgs())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	opts := wf.Options(secret, acts, log)
	opts.NoWorkers = *noWorkers
	metrics := gateway.NewMetrics()
	opts.ClientInterceptors = append(opts.ClientInterceptors, metrics.TemporalInterceptor())
	svc, err := worker.Start(ctx, opts)
	if err != nil {
		log.Error("temporal start", "err", err)
		return 1
	}
	defer svc.Stop()
	if acts != nil && wf.Reconcile {
		if rep, err := svc.Reconcile(ctx, acts); err != nil {
			log.Warn("reconcile", "err", err)
		} else {
			log.Info("reconciled", "orphans_kept", len(rep.Orphans), "foreign_untouched", len(rep.Foreign), "lost_sandboxes", len(rep.Lost))
		}
	}
	hostQ := svc.HostQueue
	if *noWorkers && wf.HostQueue == "" {
		hostQ = "" // let the workflow use its shared queue; host workers announce their own
	}
	backend := &gateway.TemporalBackend{Client: svc.Client, HostQueue: hostQ, Secret: secret, Namespace: svc.Namespace, HostPaths: hostPaths,
		DefaultSandboxTTL: sandboxTTL, DefaultSessionIdleTTL: idleTTL, FleetTimeout: *fleetTO,
		Standby: gateway.StandbyOptions{Enabled: *standby, TTL: *standbyTTL}, Log: log.With("component", "gateway")}
	if *standbyTTL <= 0 {
		log.Error("flags", "err", "--standby-ttl must be positive (turn standbys off with --standby=false)")
		return 2
	}
	// At shutdown the standbys go (before the workers stop: they remove
	// them); standbys a killed run left are taken back or removed.
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		backend.CloseStandbys(c)
	}()
	if !*noWorkers {
		// Sandboxes on this process's own workers are on this machine;
		// others are on the hosts of the registry, behind their forwarders.
		backend.LocalQueue = svc.HostQueue
		backend.LocalName, _ = os.Hostname()
	}
	if svc.Dev != nil {
		backend.UIAddress = svc.Dev.UIAddress
	}
	if *uiURL != "" {
		backend.UIAddress = *uiURL
	}
	go func() {
		if err := backend.AdoptStandbys(ctx); err != nil {
			log.Warn("standby sandboxes left by a previous run", "err", err)
		}
		if err := backend.StartSpare(ctx); err != nil {
			log.Warn("start the spare sandbox", "err", err)
		}
	}()
	srv := gateway.New(backend, token, log.With("component", "gateway"))
	srv.SetMetrics(metrics)

	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen", "addr", *listen, "err", err)
		return 1
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ctx, l) }()
	if *unixSock != "" {
		ul, err := listenUnix(*unixSock)
		if err != nil {
			log.Error("listen", "socket", *unixSock, "err", err)
			return 1
		}
		defer os.Remove(*unixSock)
		go func() { errc <- srv.Serve(ctx, ul) }()
	}

	fmt.Fprintf(os.Stderr, "sandbox-gateway listening on %s (HTTP and JSON lines)\n", l.Addr())
	if *unixSock != "" {
		fmt.Fprintf(os.Stderr, "  unix socket: %s\n", *unixSock)
	}
	fmt.Fprintf(os.Stderr, "  token file: %s\n", *tokenFile)
	if svc.Dev != nil {
		ui := "off (--temporal-ui 127.0.0.1:8233 turns it on)"
		if svc.Dev.UILogin != "" {
			ui = "log in at " + svc.Dev.UILogin
		}
		fmt.Fprintf(os.Stderr, "  embedded Temporal at %s (only for clients holding the deployment secret), UI %s\n", svc.Dev.Address, ui)
	}
	fmt.Fprintf(os.Stderr, "  allowed roots (workspaces, exports): %s\n", strings.Join(hostPaths.Roots(), ", "))
	if *standby {
		fmt.Fprintf(os.Stderr, "  standby sandboxes: on (after a create, one empty sandbox of its image waits %s for the next create; --standby=false turns them off)\n", *standbyTTL)
	}
	fmt.Fprintf(os.Stderr, "  OpenAPI: http://%s/v1/openapi.json; MCP: http://%s/mcp/{management,runtime,observability}; metrics: /metrics; health: /healthz\n", l.Addr(), l.Addr())
	fmt.Fprintf(os.Stderr, "  console: http://%s/ (sign in with the URL `sandbox-manager-cli --gateway-endpoint %s console` prints)\n", l.Addr(), l.Addr())
	fmt.Fprintf(os.Stderr, "  try: sandbox-manager-cli --gateway-endpoint %s create_sandbox --image eos-test-busybox:1 --workspace-root \"$PWD\"   (any local image; none is pulled)\n", l.Addr())
	fmt.Fprintf(os.Stderr, "   or: curl -s -H \"Authorization: Bearer $(cat %s)\" -d '{}' http://%s/v1/ops/list_sandboxes\n", *tokenFile, l.Addr())

	select {
	case <-ctx.Done():
		return 0
	case err := <-errc:
		if err != nil && !errors.Is(err, net.ErrClosed) {
			log.Error("serve", "err", err)
			return 1
		}
		return 0
	}
}

func listenUnix(path string) (net.Listener, error) {
	if len(path) > 100 {
		return nil, fmt.Errorf("socket path longer than 100 bytes")
	}
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("%s already exists", path)
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	return l, err
}
