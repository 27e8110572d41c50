package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/temporalio/cli/temporalcli/devserver"
	"go.temporal.io/server/temporal"
	"google.golang.org/grpc"
)

// DevServerOptions configure the embedded Temporal dev server.
type DevServerOptions struct {
	StateDir  string // the SQLite file lives here (temporal.db)
	Namespace string // default "default"
	Address   string // frontend host:port, default 127.0.0.1:7233 (":0" picks a free port)
	UIAddress string // "" or "off" = no UI (the default); else host:port of the UI behind a login
	// Secret is the deployment secret: the frontend answers only RPCs
	// carrying FrontendToken(Secret), the UI only UIToken(Secret). Required.
	Secret []byte
	Logger *slog.Logger
}

// DevServer is a running embedded Temporal.
type DevServer struct {
	srv     temporal.Server
	ui      *temporalUI
	Address string
	// HTTPAddress is the frontend's HTTP API (the same token guards it).
	HTTPAddress string
	UIAddress   string // "" when the UI is off
	// UILogin is the URL that logs a browser in to the UI ("" when off).
	UILogin   string
	Namespace string
	unlock    func() // the state dir's lock (lockStateDir)
}

// StartDevServer starts Temporal's dev server in this process: SQLite in
// the state dir (WAL, synchronous=normal) and the settings that remove the
// dev server's 50 ms hand-offs (see the temporal probe's findings); its
// frontend answers only the deployment's token, its internal services
// (and the internal frontend of Temporal's system worker) only internode
// mTLS (embedded.go).
func StartDevServer(ctx context.Context, o DevServerOptions) (*DevServer, error) {
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Address == "" {
		o.Address = "127.0.0.1:7233"
	}
	if len(o.Secret) == 0 {
		return nil, errors.New("embedded temporal: a deployment secret is required (its token is the only way in)")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("temporal state dir: %w", err)
	}
	unlock, err := lockStateDir(o.StateDir)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			unlock()
		}
	}()
	host, port, err := hostPort(o.Address)
	if err != nil {
		return nil, fmt.Errorf("temporal address %q: %w", o.Address, err)
	}
	// Temporal's frontend panics when its port is taken: say so first.
	if err := devserver.CheckPortFree(host, port); err != nil {
		return nil, fmt.Errorf("embedded temporal address %s: %w (pass --temporal-embedded-address)", net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	var rb [8]byte
	_, _ = rand.Read(rb[:])
	opts := devserver.StartOptions{
		FrontendIP: host, FrontendPort: port, Namespaces: []string{o.Namespace},
		ClusterID: hex.EncodeToString(rb[:]), MasterClusterName: "active", CurrentClusterName: "active",
		InitialFailoverVersion: 1, Logger: o.Logger, LogLevel: slog.LevelError,
		GRPCInterceptors: []grpc.UnaryServerInterceptor{frontendAuth(FrontendToken(o.Secret))},
		DatabaseFile:     filepath.Join(o.StateDir, "temporal.db"),
		SqlitePragmas:    map[string]string{"journal_mode": "wal", "synchronous": "normal"},
		DynamicConfigValues: map[string]any{
			"system.forceSearchAttributesCacheRefreshOnRead": true,
			"frontend.persistenceMaxQPS":                     10000,
			"history.persistenceMaxQPS":                      45000,
			"history.transferProcessorMaxPollRPS":            10000,
			"matching.numTaskqueueReadPartitions":            1,
			"matching.numTaskqueueWritePartitions":           1,
			"history.longPollExpirationInterval":             time.Second,
			// Every agent's publish, session create and sessionless write
			// is an Update on its sandbox's one workflow; the default of
			// 10 in flight per workflow stalls 20 agents (measured).
			"history.maxInFlightUpdates": 1000,
			// Nexus is unused, and its HTTP routes (task dispatch, operation
			// callbacks) check no token: off, they answer 404.
			"system.enableNexus": false,
		},
	}
	opts.FrontendHTTPPort = devserver.MustGetFreePort(host)
	ds := &DevServer{Address: net.JoinHostPort(host, strconv.Itoa(port)), Namespace: o.Namespace,
		HTTPAddress: net.JoinHostPort(host, strconv.Itoa(opts.FrontendHTTPPort)), unlock: unlock}
	tlsConf, err := internodeTLS()
	if err != nil {
		return nil, fmt.Errorf("embedded temporal: %w", err)
	}
	srv, err := newEmbeddedServer(opts, tlsConf)
	if err != nil {
		return nil, fmt.Errorf("embedded temporal: %w", err)
	}
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start embedded temporal: %w", err)
	}
	ds.srv = srv
	if o.UIAddress != "" && o.UIAddress != "off" {
		ui, err := startUI(o.UIAddress, ds.Address, FrontendToken(o.Secret), UIToken(o.Secret), o.Logger)
		if err != nil {
			srv.Stop()
			return nil, err
		}
		ds.ui, ds.UIAddress = ui, ui.Addr
		ds.UILogin = "http://" + ui.Addr + "/?login=" + UIToken(o.Secret)
	}
	started = true
	return ds, nil
}

// Stop stops the server.
func (d *DevServer) Stop() {
	if d.ui != nil {
		d.ui.Stop()
	}
	d.srv.Stop()
	d.unlock()
}

func hostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, err
	}
	if port == 0 {
		port = devserver.MustGetFreePort(h)
	}
	return h, port, nil
}
