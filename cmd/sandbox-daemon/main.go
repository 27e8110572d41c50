// Command sandbox-daemon is the runtime inside every sandbox container: PID 1
// (a small supervisor), the RPC server, the session manager, and — re-executed
// in other modes — libcontainer's init and each session's init.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ephemeral-sandbox/sandbox/internal/sigdefault"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/command"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
)

func main() {
	runtime.InitMain() // libcontainer's re-exec hook: must run first
	// Sessions and their commands start with SIGHUP and SIGINT at their
	// defaults even if whatever started the daemon ignored them.
	sigdefault.ForChildren()
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "sessinit":
			os.Exit(runtime.SessionInitMain(os.Args[2:]))
		case "serve":
			os.Exit(serve(os.Args[2:]))
		case "version":
			fmt.Println("sandbox-daemon", version)
			return
		}
	}
	if os.Getpid() == 1 {
		os.Exit(sandboxinit.Supervise(os.Args[1:]))
	}
	os.Exit(serve(os.Args[1:]))
}

var version = "dev"

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func serve(args []string) int {
	fs := flag.NewFlagSet("sandbox-daemon", flag.ContinueOnError)
	var cfg sandboxinit.Config
	fs.StringVar(&cfg.StateDir, "state-dir", "/eos", "state volume (layer stack, sessions)")
	fs.StringVar(&cfg.Listen, "listen", ":7001", "RPC listen address")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding the sandbox token (default <state-dir>/secret/daemon.token); when it exists it wins over --token-sha256")
	fs.StringVar(&cfg.TokenSHA256, "token-sha256", "", "the sandbox token's SHA-256 (64 hex digits): the daemon checks presented tokens against it when there is no token file")
	fs.StringVar(&cfg.SelfPath, "self", "", "path of this binary inside sessions (default: its own path)")
	fs.StringVar(&cfg.SessinitPath, "sessinit", "", "the session init binary (default: sandbox-sessinit next to this binary if it is there, else this binary)")
	fs.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", 10*time.Second, "how long running commands get to end on shutdown")
	fs.IntVar(&cfg.AutoSquashAt, "autosquash-at", 100, "squash the layer stack past this many layers (-1: never)")
	fs.Int64Var(&cfg.MaxRequestBytes, "max-request-bytes", 16<<20, "largest request body (64 KiB-1 GiB)")
	fs.StringVar(&cfg.SandboxID, "sandbox-id", "", "the sandbox's id, shown in the observability views (the gateway may pass it per request instead)")
	fs.Int64Var(&cfg.EventBudget, "observability-max-bytes", 4<<20, "disk budget of the span and event log (1-16 MiB)")
	fs.Int64Var(&cfg.SampleBudget, "samples-max-bytes", 1<<20, "disk budget of the resource samples (128 KiB-4 MiB)")
	fs.DurationVar(&cfg.SampleInterval, "sample-interval", 2*time.Second, "resource sampling interval while the sandbox is active (250ms-10m)")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", sandboxinit.DefaultMaxSessions, "workspace sessions the sandbox may have at once; more are refused with resource_exhausted")
	fs.IntVar(&cfg.WarmSessions, "warm-sessions", sandboxinit.DefaultWarmSessions, fmt.Sprintf("pre-started sessions a plain create_workspace_session adopts while the head has not moved (0: none, at most %d)", sandboxinit.MaxWarmSessions))
	fs.IntVar(&cfg.MaxRunningCommands, "max-running-commands", command.DefaultMaxRunning, "commands that may run at once; more are refused with resource_exhausted")
	fs.Int64Var(&cfg.OutputBudget, "output-budget-bytes", command.DefaultOutputBudget, "output kept by all commands together; past it the oldest finished ones lose theirs (reads say output_dropped)")
	fs.Int64Var(&cfg.MaxPublishBytes, "max-publish-bytes", sandboxinit.DefaultMaxPublishBytes, "bytes of files in one published change set; larger ones are refused with resource_exhausted")
	// Off by default (the RPC cap bounds them, normal weight): one lane
	// at nice 10 lowered the interactive p99 at 50 agents but cost 40% of
	// the loops/s on 2 cores (bench scenario e, side by side).
	fs.IntVar(&cfg.BackgroundLanes, "background-lanes", 128, "heavy background operations (session create, publish, archive, squash, import) run at once; the rest wait in FIFO order (0: max(1, NumCPU/2); 1 puts exec and file ops first at a cost in throughput); exec, file operations and reads never wait")
	fs.DurationVar(&cfg.BackgroundQueueWait, "background-queue-wait", sandboxinit.DefaultBackgroundQueueWait, "how long a background operation waits for the lane before it is refused with server_busy")
	fs.IntVar(&cfg.BackgroundNice, "background-nice", -1, "nice value (1-19) of the threads running background operations, e.g. 10 with --background-lanes 1; -1: normal CPU weight")
	fs.IntVar(&cfg.WarmNice, "warm-nice", 10, "nice value (1-19) of the daemon's threads that build warm sessions and finish destroyed sessions' teardowns; the sessions' own processes keep normal weight (0: normal CPU weight)")
	guard := fs.String("ingress-guard", "auto", "drop everything new entering the sandbox's network namespace from outside but connections to the --listen port (on, off, auto: on when this daemon is process 1; the supervisor, process 1 of a sandbox container, passes on)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch *guard {
	case "on", "off":
		cfg.GuardIngress = *guard == "on"
	case "auto":
		// Process 1: a container's entrypoint, in the sandbox's own
		// network namespace; never a daemon started on a host.
		cfg.GuardIngress = os.Getpid() == 1
	default:
		fmt.Fprintf(os.Stderr, "sandbox-daemon: --ingress-guard %q: want on, off or auto\n", *guard)
		return 2
	}
	if cfg.WarmSessions < 0 || cfg.WarmSessions > sandboxinit.MaxWarmSessions {
		fmt.Fprintf(os.Stderr, "sandbox-daemon: --warm-sessions %d: want 0 to %d\n", cfg.WarmSessions, sandboxinit.MaxWarmSessions)
		return 2
	}
	if err := cfg.CheckObservability(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-daemon:", err)
		return 2
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if cfg.SelfPath == "" {
		if p, err := os.Executable(); err == nil {
			cfg.SelfPath = p
		}
	}
	if cfg.SessinitPath == "" && cfg.SelfPath != "" {
		if p := filepath.Join(filepath.Dir(cfg.SelfPath), "sandbox-sessinit"); isExecutable(p) {
			cfg.SessinitPath = p
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := sandboxinit.New(ctx, cfg)
	if err != nil {
		cfg.Logger.Error("daemon start failed", "err", err)
		return 1
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		cfg.Logger.Error("listen", "err", err)
		return 1
	}
	srv := sandboxinit.NewServer(d)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	cfg.Logger.Info("daemon ready", "listen", l.Addr().String(), "version", version)
	select {
	case <-ctx.Done():
	case err := <-errc:
		cfg.Logger.Error("serve", "err", err)
	}
	// Stop admitting, let commands end (or kill them after the grace), sync.
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace+5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	_ = d.Close(sctx)
	syscall.Sync()
	cfg.Logger.Info("daemon stopped")
	return 0
}
