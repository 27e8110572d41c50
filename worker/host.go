package worker

import (
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/hostlink"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// HostNamePattern is the shape of a host's name (--host-name, create_sandbox
// host).
var HostNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// HostOptions make a worker one Docker host of a cluster: it serves the
// forwarder (hostlink) on Advertise and beats into the host registry, so
// a gateway elsewhere places sandboxes here and reaches their daemons.
type HostOptions struct {
	Name      string // the host's name (default: the hostname)
	Advertise string // host:port the gateways dial (and this worker listens on)
	Listen    string // listen address when it differs from Advertise ("" = Advertise)
	// CertFile and KeyFile: the forwarder's certificate (e.g. from the
	// cluster's CA); "" = a self-signed one kept in CertDir.
	CertFile, KeyFile, CertDir string
	Secret                     []byte
}

// Host is a running forwarder and heartbeat.
type Host struct {
	Name, Queue, Advertise, Fingerprint string
	svc                                 *Service
	acts                                *activities.Activities
	cancel                              context.CancelFunc
	done                                chan struct{}
}

// ServeHost starts the forwarder and the heartbeat; the first beat is sent
// before it returns, so the host is placeable at once.
func ServeHost(ctx context.Context, svc *Service, acts *activities.Activities, o HostOptions) (*Host, error) {
	if o.Name == "" {
		o.Name, _ = os.Hostname()
	}
	if !HostNamePattern.MatchString(o.Name) {
		return nil, fmt.Errorf("host name %q: 1-63 characters of [A-Za-z0-9_.-]", o.Name)
	}
	host, port, err := net.SplitHostPort(o.Advertise)
	if err != nil || host == "" || port == "" || port == "0" {
		return nil, fmt.Errorf("--advertise-addr %q: want host:port", o.Advertise)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("--advertise-addr %q: gateways dial it, so it must be this host's address (listen on all with --hostlink-listen 0.0.0.0:%s)", o.Advertise, port)
	}
	var cert hostlink.Cert
	if o.CertFile != "" {
		cert, err = hostlink.LoadCert(o.CertFile, o.KeyFile)
	} else {
		cert, err = hostlink.LoadOrCreateCert(o.CertDir, []string{host})
	}
	if err != nil {
		return nil, err
	}
	listen := o.Listen
	if listen == "" {
		listen = o.Advertise
	}
	hctx, cancel := context.WithCancel(context.Background())
	srv := &hostlink.Server{Secret: o.Secret, Host: o.Name, Log: svc.log.With("component", "hostlink"),
		Lookup: func(ctx context.Context, id string) (api.Endpoint, error) {
			return activities.LocalDaemon(ctx, acts, id)
		},
		// The sandbox workflows this worker runs leave copies of their
		// state in this process: a gateway elsewhere reads a busy
		// sandbox's state from here rather than wait on its query.
		State: func(id, run string, historyLen int64) ([]byte, bool) {
			return workflows.MirroredCopyJSON(workflows.SandboxWorkflowID(id), run, historyLen)
		}}
	if _, _, err := hostlink.Listen(hctx, listen, cert, srv); err != nil {
		cancel()
		return nil, fmt.Errorf("forwarder listen %s: %w", listen, err)
	}
	h := &Host{Name: o.Name, Queue: svc.HostQueue, Advertise: o.Advertise, Fingerprint: cert.Fingerprint, svc: svc, acts: acts,
		cancel: cancel, done: make(chan struct{})}
	if err := h.beat(ctx, false); err != nil {
		cancel()
		return nil, fmt.Errorf("register host %s: %w", o.Name, err)
	}
	go h.loop(hctx)
	return h, nil
}

func (h *Host) loop(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(workflows.HostBeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			bctx, cancel := context.WithTimeout(ctx, workflows.HostBeatInterval)
			if err := h.beat(bctx, false); err != nil && ctx.Err() == nil {
				h.svc.log.Warn("host heartbeat", "host", h.Name, "err", err)
			}
			cancel()
		}
	}
}

func (h *Host) beat(ctx context.Context, leaving bool) error {
	n, err := activities.CountSandboxes(ctx, h.acts)
	if err != nil && !leaving {
		return err
	}
	b := workflows.HostBeat{Name: h.Name, Queue: h.Queue, Advertise: h.Advertise, Fingerprint: h.Fingerprint, Sandboxes: n, Leaving: leaving}
	_, err = h.svc.Client.SignalWithStartWorkflow(ctx, workflows.HostRegistryWorkflowID, workflows.SignalHostBeat, b,
		client.StartWorkflowOptions{ID: workflows.HostRegistryWorkflowID, TaskQueue: workflows.TaskQueue,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE},
		workflows.HostRegistryWorkflowName, []workflows.HostInfo(nil))
	return err
}

// Stop ends the heartbeat and the forwarder, and tells the registry the
// host is leaving (its sandboxes are unavailable at once, not after
// HostStaleAfter).
func (h *Host) Stop() {
	h.cancel()
	<-h.done
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := h.beat(ctx, true); err != nil {
		h.svc.log.Warn("host leaving", "host", h.Name, "err", err)
	}
}
