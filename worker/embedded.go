package worker

// The embedded server is built here rather than by devserver.Start: that
// function of temporalio/cli v1.5.1 takes no server options and no TLS
// config, and its history, matching and worker services then listen on
// loopback ports that answer anyone on the machine. This is the same
// construction (adapted from devserver/server.go and log.go, MIT licensed,
// Copyright (c) 2022 Temporal Technologies Inc.) with what the product
// needs added: internode mutual TLS with a CA made in memory at each start,
// so only this process's own services can talk to each other; an internal
// frontend behind that TLS for Temporal's system worker; and the token
// check on the public frontend (temporalauth.go).

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/temporalio/cli/temporalcli/devserver"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	tlog "go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	"go.temporal.io/server/components/callbacks"
	"go.temporal.io/server/components/nexusoperations"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
)

// newEmbeddedServer builds (does not start) the server s describes, with
// tlsConf as its TLS settings.
func newEmbeddedServer(s devserver.StartOptions, tlsConf config.RootTLS) (temporal.Server, error) {
	conf, err := embeddedConfig(s)
	if err != nil {
		return nil, err
	}
	conf.Global.TLS = tlsConf
	logger := slogLogger{log: s.Logger, level: s.LogLevel}
	hostOf := func(svc primitives.ServiceName) static.Hosts {
		return static.SingleLocalHost(fmt.Sprintf("%v:%v", devserver.MaybeEscapeIPv6(s.FrontendIP), conf.Services[string(svc)].RPC.GRPCPort))
	}
	opts := []temporal.ServerOption{
		temporal.WithConfig(conf),
		temporal.ForServices(append([]string{string(primitives.InternalFrontendService)}, temporal.DefaultServices...)),
		temporal.WithStaticHosts(map[primitives.ServiceName]static.Hosts{
			primitives.FrontendService:         hostOf(primitives.FrontendService),
			primitives.InternalFrontendService: hostOf(primitives.InternalFrontendService),
			primitives.MatchingService:         hostOf(primitives.MatchingService),
			primitives.HistoryService:          hostOf(primitives.HistoryService),
			primitives.WorkerService:           hostOf(primitives.WorkerService),
		}),
		temporal.WithLogger(logger),
	}
	dyn := make(dynamicconfig.StaticClient, len(s.DynamicConfigValues)+4)
	dyn[dynamicconfig.HistoryCacheHostLevelMaxSize.Key()] = 8096
	dyn[dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key()] = 100
	httpAddr := fmt.Sprintf("%s:%d", devserver.MaybeEscapeIPv6(s.FrontendIP), s.FrontendHTTPPort)
	dyn[nexusoperations.CallbackURLTemplate.Key()] = "http://" + httpAddr + "/namespaces/{{.NamespaceName}}/nexus/callback"
	dyn[callbacks.AllowedAddresses.Key()] = []struct {
		Pattern       string
		AllowInsecure bool
	}{{Pattern: httpAddr, AllowInsecure: true}}
	for k, v := range s.DynamicConfigValues {
		dyn[dynamicconfig.Key(k)] = v
	}
	opts = append(opts, temporal.WithDynamicConfigClient(dyn))
	if len(s.GRPCInterceptors) > 0 {
		opts = append(opts, temporal.WithChainedFrontendGrpcInterceptors(s.GRPCInterceptors...))
	}
	return temporal.NewServer(opts...)
}

func embeddedConfig(s devserver.StartOptions) (*config.Config, error) {
	var conf config.Config
	conf.Global.Membership.MaxJoinDuration = 30 * time.Second
	conf.Global.Membership.BroadcastAddress = s.FrontendIP
	conf.Persistence.DefaultStore = "sqlite-default"
	conf.Persistence.VisibilityStore = "sqlite-default"
	conf.Persistence.NumHistoryShards = 1
	sqlConf, err := embeddedSQL(s)
	if err != nil {
		return nil, err
	}
	conf.Persistence.DataStores = map[string]config.DataStore{"sqlite-default": {SQL: sqlConf}}
	frontend := fmt.Sprintf("%v:%v", devserver.MaybeEscapeIPv6(s.FrontendIP), s.FrontendPort)
	conf.ClusterMetadata = &cluster.Config{
		EnableGlobalNamespace:    s.EnableGlobalNamespace,
		FailoverVersionIncrement: 10,
		MasterClusterName:        s.MasterClusterName,
		CurrentClusterName:       s.CurrentClusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			s.CurrentClusterName: {
				Enabled:                true,
				InitialFailoverVersion: int64(s.InitialFailoverVersion),
				RPCAddress:             frontend,
				HTTPAddress:            fmt.Sprintf("%v:%v", devserver.MaybeEscapeIPv6(s.FrontendIP), s.FrontendHTTPPort),
				ClusterID:              s.ClusterID,
			},
		},
	}
	conf.DCRedirectionPolicy.Policy = "noop"
	service := func(frontend bool) config.Service {
		var c config.Service
		c.RPC.BindOnIP = s.FrontendIP
		if frontend {
			c.RPC.GRPCPort, c.RPC.HTTPPort = s.FrontendPort, s.FrontendHTTPPort
		} else {
			c.RPC.GRPCPort = devserver.MustGetFreePort(s.FrontendIP)
		}
		return c
	}
	// Temporal's own system worker reaches the frontend API through the
	// internal frontend, over internode mTLS: the public frontend then
	// admits nothing but the token.
	internal := service(false)
	internal.RPC.HTTPPort = devserver.MustGetFreePort(s.FrontendIP)
	conf.Services = map[string]config.Service{
		"frontend": service(true), "internal-frontend": internal,
		"history": service(false), "matching": service(false), "worker": service(false),
	}
	conf.Archival.History.State = "disabled"
	conf.Archival.Visibility.State = "disabled"
	conf.NamespaceDefaults.Archival.History.State = "disabled"
	conf.NamespaceDefaults.Archival.Visibility.State = "disabled"
	return &conf, nil
}

func embeddedSQL(s devserver.StartOptions) (*config.SQL, error) {
	conf := config.SQL{PluginName: sqliteplugin.PluginName}
	if s.DatabaseFile == "" {
		conf.ConnectAttributes = map[string]string{"mode": "memory", "cache": "shared"}
		conf.DatabaseName = strconv.Itoa(rand.IntN(9999999))
	} else {
		conf.ConnectAttributes = map[string]string{"mode": "rwc"}
		conf.DatabaseName = s.DatabaseFile
	}
	for k, v := range s.SqlitePragmas {
		conf.ConnectAttributes[k] = v
	}
	if s.DatabaseFile != "" {
		if _, err := os.Stat(s.DatabaseFile); os.IsNotExist(err) {
			if _, err := os.Stat(filepath.Dir(s.DatabaseFile)); err != nil {
				return nil, fmt.Errorf("temporal database dir: %w", err)
			}
			if err := sqliteschema.SetupSchema(&conf); err != nil {
				return nil, fmt.Errorf("set up the temporal schema: %w", err)
			}
		}
	}
	namespaces := make([]*sqliteschema.NamespaceConfig, len(s.Namespaces))
	for i, ns := range s.Namespaces {
		nsConfig, err := sqliteschema.NewNamespaceConfig(s.CurrentClusterName, ns, false, s.SearchAttributes)
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
		namespaces[i] = nsConfig
	}
	if err := sqliteschema.CreateNamespaces(&conf, namespaces...); err != nil {
		return nil, fmt.Errorf("create namespaces: %w", err)
	}
	return &conf, nil
}

// slogLogger is the server's logger over slog (devserver's log.go).
type slogLogger struct {
	log   *slog.Logger
	level slog.Level
}

var (
	_ tlog.Logger      = slogLogger{}
	_ tlog.SLogWrapper = slogLogger{}
)

func (s slogLogger) Debug(msg string, tags ...tag.Tag)  { s.Log(slog.LevelDebug, msg, tags) }
func (s slogLogger) Info(msg string, tags ...tag.Tag)   { s.Log(slog.LevelInfo, msg, tags) }
func (s slogLogger) Warn(msg string, tags ...tag.Tag)   { s.Log(slog.LevelWarn, msg, tags) }
func (s slogLogger) Error(msg string, tags ...tag.Tag)  { s.Log(slog.LevelError, msg, tags) }
func (s slogLogger) DPanic(msg string, tags ...tag.Tag) { s.Log(slog.LevelError, msg, tags) }
func (s slogLogger) Panic(msg string, tags ...tag.Tag)  { s.Log(slog.LevelError, msg, tags) }
func (s slogLogger) Fatal(msg string, tags ...tag.Tag)  { s.Log(slog.LevelError, msg, tags) }
func (s slogLogger) SLog() *slog.Logger                 { return s.log }

func (s slogLogger) Log(level slog.Level, msg string, tags []tag.Tag) {
	if level >= s.level && s.log.Enabled(context.Background(), level) {
		attrs := make([]slog.Attr, len(tags))
		for i, t := range tags {
			attrs[i] = slog.Any(t.Key(), t.Value())
		}
		s.log.LogAttrs(context.Background(), level, msg, attrs...)
	}
}
