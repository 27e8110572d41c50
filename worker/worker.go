package worker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/grpc"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// Options configure the lifecycle service.
type Options struct {
	StateDir        string // ~/.ephemeral-sandbox by default; the embedded server's SQLite lives here
	TemporalAddress string // "" = TEMPORAL_ADDRESS, else the embedded dev server
	Namespace       string // "" = TEMPORAL_NAMESPACE, else "default"
	UIAddress       string // embedded UI host:port behind a login; "" or "off" (the default) = no UI
	// Secret is the deployment secret. The embedded Temporal answers only
	// clients presenting FrontendToken(Secret), and this client presents it
	// (to an external cluster too, unless TEMPORAL_TLS* configures mTLS,
	// which then authenticates instead). Required for the embedded server.
	Secret           []byte
	EmbeddedAddress  string // embedded frontend, default 127.0.0.1:7233
	HostQueue        string // this worker's own task queue, default "eos-host-<hostname>"
	Activities       *activities.Activities
	NoWorkers        bool // a client only (the gateway in front of separate sandbox-workers)
	NoWorkflowWorker bool // a host worker that runs only its own queue's activities
	Interceptors     []interceptor.WorkerInterceptor
	// ClientInterceptors wrap every unary RPC of the Temporal client (the
	// gateway measures Temporal round trips with one).
	ClientInterceptors []grpc.UnaryClientInterceptor
	Logger             *slog.Logger
}

// Service is a connected Temporal client plus the workers of this process.
type Service struct {
	Client    client.Client
	Dev       *DevServer // nil when an external cluster is used
	HostQueue string
	Namespace string
	// ClusterID is the Temporal cluster's id (GetClusterInfo); objects
	// carry it as their owner.
	ClusterID string
	workers   []worker.Worker
	log       *slog.Logger
}

// Start connects (starting the embedded server if needed) and runs workers.
func Start(ctx context.Context, o Options) (*Service, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if o.TemporalAddress == "" {
		o.TemporalAddress = os.Getenv("TEMPORAL_ADDRESS")
	}
	if o.Namespace == "" {
		o.Namespace = os.Getenv("TEMPORAL_NAMESPACE")
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.HostQueue == "" {
		h, _ := os.Hostname()
		o.HostQueue = "eos-host-" + h
	}
	svc := &Service{HostQueue: o.HostQueue, Namespace: o.Namespace, log: o.Logger}
	addr := o.TemporalAddress
	if addr == "" {
		dev, err := StartDevServer(ctx, DevServerOptions{StateDir: o.StateDir, Namespace: o.Namespace,
			Address: o.EmbeddedAddress, UIAddress: o.UIAddress, Secret: o.Secret, Logger: o.Logger.With("component", "temporal")})
		if err != nil {
			return nil, err
		}
		svc.Dev, addr = dev, dev.Address
	}
	// The SDK's default identity (pid@hostname@) with the host's queue, so
	// the Temporal UI and a workflow's history say which host's worker
	// ran each task.
	hostname, _ := os.Hostname()
	copts := client.Options{HostPort: addr, Namespace: o.Namespace, Logger: sdklog.NewStructuredLogger(o.Logger.With("component", "temporal-sdk")),
		Identity: fmt.Sprintf("%d@%s@%s", os.Getpid(), hostname, o.HostQueue)}
	tlsCfg, err := tlsFromEnv()
	if err != nil {
		svc.Stop()
		return nil, err
	}
	if tlsCfg != nil && svc.Dev == nil {
		copts.ConnectionOptions.TLS = tlsCfg
	} else if len(o.Secret) > 0 {
		copts.HeadersProvider = Headers(o.Secret)
	}
	copts.ConnectionOptions.DialOptions = append(copts.ConnectionOptions.DialOptions,
		grpc.WithChainUnaryInterceptor(append(append([]grpc.UnaryClientInterceptor(nil), o.ClientInterceptors...), closingRetry)...))
	c, err := client.DialContext(ctx, copts)
	if err != nil {
		svc.Stop()
		return nil, fmt.Errorf("connect to temporal at %s: %w", addr, err)
	}
	svc.Client = c
	svc.ClusterID = clusterID(ctx, c)
	if o.NoWorkers {
		return svc, nil
	}
	if o.Activities == nil {
		svc.Stop()
		return nil, errors.New("worker: Activities are required to run workers")
	}
	// Every Docker object the activities make says which Temporal cluster
	// and namespace own it, so no other deployment takes it for its own.
	activities.SetOwner(o.Activities, svc.ClusterID, o.Namespace)
	activities.SetHostQueue(o.Activities, o.HostQueue)
	// A sandbox's workflow may run here while its daemon is on another
	// host: its local daemon calls go through that host's forwarder.
	activities.SetHostRegistry(o.Activities, c)
	ics := o.Interceptors
	if fp := FailpointInterceptor(); fp != nil { // crash drills only: armed by the environment
		o.Logger.Warn("worker failpoint armed: the process kills itself after that activity", "failpoint", os.Getenv(FailpointEnv))
		ics = append(append([]interceptor.WorkerInterceptor(nil), ics...), fp)
	}
	wopts := worker.Options{DisableRegistrationAliasing: true, Interceptors: ics}
	if !o.NoWorkflowWorker {
		shared := worker.New(c, workflows.TaskQueue, wopts)
		Register(shared, o.Activities)
		svc.workers = append(svc.workers, shared)
	}
	host := worker.New(c, o.HostQueue, wopts)
	host.RegisterActivityWithOptions(o.Activities, activity.RegisterOptions{SkipInvalidStructFunctions: true})
	svc.workers = append(svc.workers, host)
	for _, w := range svc.workers {
		if err := w.Start(); err != nil {
			svc.Stop()
			return nil, fmt.Errorf("start worker: %w", err)
		}
	}
	return svc, nil
}

// Register registers the workflows by their stable names and the
// activities (every exported method of *Activities).
func Register(r worker.Registry, acts *activities.Activities) {
	r.RegisterWorkflowWithOptions(workflows.SandboxWorkflow, workflow.RegisterOptions{Name: workflows.SandboxWorkflowName})
	r.RegisterWorkflowWithOptions(workflows.PublishWorkflow, workflow.RegisterOptions{Name: workflows.PublishWorkflowName})
	r.RegisterWorkflowWithOptions(workflows.HostOpWorkflow, workflow.RegisterOptions{Name: workflows.HostOpWorkflowName})
	r.RegisterWorkflowWithOptions(workflows.HostRegistryWorkflow, workflow.RegisterOptions{Name: workflows.HostRegistryWorkflowName})
	if acts != nil {
		// Helpers such as Inspect and RemoveLeftovers are exported for the
		// reconciler, not activities: skip what is not a valid activity.
		r.RegisterActivityWithOptions(acts, activity.RegisterOptions{SkipInvalidStructFunctions: true})
	}
}

// Stop stops the workers, the client and the embedded server.
func (s *Service) Stop() {
	for _, w := range s.workers {
		w.Stop()
	}
	if s.Client != nil {
		s.Client.Close()
	}
	if s.Dev != nil {
		s.Dev.Stop()
	}
}

// tlsFromEnv builds client TLS from TEMPORAL_TLS_CERT, TEMPORAL_TLS_KEY,
// TEMPORAL_TLS_CA (file paths) and TEMPORAL_TLS=true.
func tlsFromEnv() (*tls.Config, error) {
	cert, key, ca := os.Getenv("TEMPORAL_TLS_CERT"), os.Getenv("TEMPORAL_TLS_KEY"), os.Getenv("TEMPORAL_TLS_CA")
	if cert == "" && ca == "" && !strings.EqualFold(os.Getenv("TEMPORAL_TLS"), "true") {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("temporal TLS client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if ca != "" {
		b, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("temporal TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("temporal TLS CA %s holds no certificate", ca)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// clusterID asks the Temporal cluster for its id ("" when it does not say).
func clusterID(ctx context.Context, c client.Client) string {
	info, err := c.WorkflowService().GetClusterInfo(ctx, &workflowservice.GetClusterInfoRequest{})
	if err != nil {
		return ""
	}
	return info.GetClusterId()
}
