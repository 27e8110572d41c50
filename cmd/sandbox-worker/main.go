// Command sandbox-worker runs the lifecycle workers alone: the shared
// workflow queue and this Docker host's own activity queue, against the
// Temporal cluster in TEMPORAL_ADDRESS (or the embedded dev server).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/worker"
)

func main() { os.Exit(run()) }

func run() int {
	var (
		stateDir  = flag.String("state-dir", worker.DefaultStateDir(), "state directory (secret, embedded Temporal data)")
		address   = flag.String("temporal-address", "", "Temporal frontend host:port (default $TEMPORAL_ADDRESS, else an embedded dev server)")
		namespace = flag.String("namespace", "", "Temporal namespace (default $TEMPORAL_NAMESPACE or default)")
		hostQueue = flag.String("host-queue", "", "this host's activity task queue (default eos-host-<hostname>)")
		daemonBin = flag.String("daemon-binary", "", "static sandbox-daemon to copy into sandboxes")
		seccomp   = flag.String("seccomp-profile", "", "sandbox seccomp profile (default: next to the daemon binary, or sandboxinit/runtime/seccomp.json)")
		onlyHost  = flag.Bool("host-only", false, "run only this host's activity queue (workflows run elsewhere)")
		reconcile = flag.Bool("reconcile", true, "remove Docker objects no running sandbox owns, at start")
		verbose   = flag.Bool("v", false, "debug logging")
	)
	flag.Parse()
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	acts, err := buildActivities(*stateDir, *daemonBin, *seccomp, log)
	if err != nil {
		log.Error("worker setup", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	svc, err := worker.Start(ctx, worker.Options{StateDir: filepath.Join(*stateDir, "temporal"), TemporalAddress: *address,
		Namespace: *namespace, HostQueue: *hostQueue, Activities: acts, NoWorkflowWorker: *onlyHost, Logger: log})
	if err != nil {
		log.Error("worker start", "err", err)
		return 1
	}
	defer svc.Stop()
	if *reconcile {
		if rep, err := svc.Reconcile(ctx, acts); err != nil {
			log.Warn("reconcile", "err", err)
		} else {
			log.Info("reconciled", "removed", len(rep.Removed), "lost_sandboxes", len(rep.Lost))
		}
	}
	log.Info("worker running", "host_queue", svc.HostQueue, "namespace", svc.Namespace)
	if svc.Dev != nil {
		fmt.Fprintf(os.Stderr, "embedded Temporal at %s, UI http://%s\n", svc.Dev.Address, svc.Dev.UIAddress)
	}
	<-ctx.Done()
	return 0
}

func buildActivities(stateDir, daemonBin, seccomp string, log *slog.Logger) (*activities.Activities, error) {
	secret, err := worker.LoadOrCreateSecret(filepath.Join(stateDir, "gateway.secret"))
	if err != nil {
		return nil, err
	}
	return worker.BuildActivities(secret, daemonBin, seccomp, log)
}
