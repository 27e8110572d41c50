package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/temporalio/cli/temporalcli/devserver"
)

// DevServerOptions configure the embedded Temporal dev server.
type DevServerOptions struct {
	StateDir  string // the SQLite file lives here (temporal.db)
	Namespace string // default "default"
	Address   string // frontend host:port, default 127.0.0.1:7233 (":0" picks a free port)
	UIAddress string // default 127.0.0.1:8233; "off" disables the UI
	Logger    *slog.Logger
}

// DevServer is a running embedded Temporal.
type DevServer struct {
	srv       *devserver.Server
	Address   string
	UIAddress string
	Namespace string
}

// StartDevServer starts Temporal's dev server in this process: SQLite in
// the state dir (WAL, synchronous=normal) and the settings that remove the
// dev server's 50 ms hand-offs (see the temporal probe's findings).
func StartDevServer(ctx context.Context, o DevServerOptions) (*DevServer, error) {
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Address == "" {
		o.Address = "127.0.0.1:7233"
	}
	if o.UIAddress == "" {
		o.UIAddress = "127.0.0.1:8233"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("temporal state dir: %w", err)
	}
	host, port, err := hostPort(o.Address)
	if err != nil {
		return nil, fmt.Errorf("temporal address %q: %w", o.Address, err)
	}
	var rb [8]byte
	_, _ = rand.Read(rb[:])
	opts := devserver.StartOptions{
		FrontendIP: host, FrontendPort: port, Namespaces: []string{o.Namespace},
		ClusterID: hex.EncodeToString(rb[:]), MasterClusterName: "active", CurrentClusterName: "active",
		InitialFailoverVersion: 1, Logger: o.Logger, LogLevel: slog.LevelError,
		DatabaseFile:  filepath.Join(o.StateDir, "temporal.db"),
		SqlitePragmas: map[string]string{"journal_mode": "wal", "synchronous": "normal"},
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
		},
	}
	ds := &DevServer{Address: net.JoinHostPort(host, strconv.Itoa(port)), Namespace: o.Namespace}
	if o.UIAddress != "off" {
		uh, up, err := hostPort(o.UIAddress)
		if err != nil {
			return nil, fmt.Errorf("temporal UI address %q: %w", o.UIAddress, err)
		}
		opts.UIIP, opts.UIPort = uh, up
		ds.UIAddress = net.JoinHostPort(uh, strconv.Itoa(up))
	}
	srv, err := devserver.Start(opts)
	if err != nil {
		return nil, fmt.Errorf("start embedded temporal: %w", err)
	}
	ds.srv = srv
	return ds, nil
}

// Stop stops the server.
func (d *DevServer) Stop() { d.srv.Stop() }

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
