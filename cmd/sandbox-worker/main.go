// Command sandbox-worker runs the lifecycle workers alone: the shared
// workflow queue and this Docker host's own activity queue, against the
// Temporal cluster in TEMPORAL_ADDRESS (or the embedded dev server).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/config"
	"github.com/ephemeral-sandbox/sandbox/worker"
)

func main() { os.Exit(run()) }

func run() int {
	worker.TuneGC()
	var wf worker.Flags
	wf.Register(flag.CommandLine)
	onlyHost := flag.Bool("host-only", false, "run only this host's activity queue (workflows run elsewhere)")
	cfgFile := flag.String("config", os.Getenv(config.EnvVar), "the seed's gateway YAML (default $"+config.EnvVar+"): daemon settings of new sandboxes")
	var ho worker.HostOptions
	flag.StringVar(&ho.Advertise, "advertise-addr", "", "host:port where gateways on other machines reach this host's sandboxes (a TLS forwarder; the host also registers for placement). Unset: a single-machine worker")
	flag.StringVar(&ho.Listen, "hostlink-listen", "", "listen address of the forwarder when it differs from --advertise-addr (e.g. 0.0.0.0:7443 behind NAT)")
	flag.StringVar(&ho.Name, "host-name", "", "this host's name for placement (create_sandbox --host; default the hostname); the host queue defaults to eos-host-<name>")
	flag.StringVar(&ho.CertFile, "hostlink-cert", "", "forwarder TLS certificate (PEM, e.g. from the cluster CA; default a self-signed one in the state dir, pinned by fingerprint)")
	flag.StringVar(&ho.KeyFile, "hostlink-key", "", "forwarder TLS key (PEM) for --hostlink-cert")
	flag.Parse()
	if ho.Name != "" && wf.HostQueue == "" {
		wf.HostQueue = "eos-host-" + ho.Name
	}
	log := wf.Logger()
	cfg, err := config.Open(*cfgFile, log)
	if err != nil {
		log.Error("worker config", "err", err)
		return 1
	}
	secret, err := wf.Secret()
	if err != nil {
		log.Error("worker setup", "err", err)
		return 1
	}
	hostPaths, err := wf.HostPaths()
	if err != nil {
		log.Error("allowed roots (--allow-root)", "err", err)
		return 1
	}
	acts, err := worker.BuildActivities(secret, wf.DaemonBin, wf.Seccomp, hostPaths, log)
	if err != nil {
		log.Error("worker setup", "err", err)
		return 1
	}
	activities.SetDaemonArgs(acts, cfg.DaemonArgs())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	opts := wf.Options(secret, acts, log)
	opts.NoWorkflowWorker = *onlyHost
	svc, err := worker.Start(ctx, opts)
	if err != nil {
		log.Error("worker start", "err", err)
		return 1
	}
	defer svc.Stop()
	if wf.Reconcile {
		if rep, err := svc.Reconcile(ctx, acts); err != nil {
			log.Warn("reconcile", "err", err)
		} else {
			log.Info("reconciled", "orphans_kept", len(rep.Orphans), "foreign_untouched", len(rep.Foreign), "lost_sandboxes", len(rep.Lost))
		}
	}
	if ho.Advertise != "" {
		ho.Secret, ho.CertDir = secret, filepath.Join(wf.StateDir, "hostlink")
		host, err := worker.ServeHost(ctx, svc, acts, ho)
		if err != nil {
			log.Error("host forwarder", "err", err)
			return 1
		}
		defer host.Stop()
		log.Info("host registered", "host", host.Name, "advertise", host.Advertise, "fingerprint", host.Fingerprint)
	}
	log.Info("worker running", "host_queue", svc.HostQueue, "namespace", svc.Namespace)
	if svc.Dev != nil {
		fmt.Fprintf(os.Stderr, "embedded Temporal at %s\n", svc.Dev.Address)
		if svc.Dev.UILogin != "" {
			fmt.Fprintf(os.Stderr, "Temporal UI: log in at %s\n", svc.Dev.UILogin)
		}
	}
	<-ctx.Done()
	return 0
}
