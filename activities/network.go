package activities

import (
	"context"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// Every sandbox container is alone on a bridge network of its own, so
// sandboxes (and the sessions inside them) cannot reach each other: Docker
// drops traffic between bridge networks. Not always: each network Docker
// creates deletes and re-inserts its FORWARD jumps, and a connection made
// in that moment passes; so the daemon in each sandbox also drops anything
// new from outside but its own port (runtime.GuardIngress). The network is not internal:
// Docker (20.10 at least) publishes no ports of a container that is only on
// an internal network, and the daemon port must be published on
// 127.0.0.1. Egress to the outside stays as on the default bridge.

const roleNetwork = "network" // LabelRole of the network

// networkName is the sandbox's Docker network.
func networkName(sandboxID string) string { return "eos-net-" + sandboxID }

// ensureNetwork creates the sandbox's network with our labels, or adopts the
// one an earlier attempt created. A network of that name without our labels
// is a non-retryable conflict.
func (a *Activities) ensureNetwork(ctx context.Context, spec workflows.SandboxSpec) (string, error) {
	name := networkName(spec.SandboxID)
	for attempt := 0; ; attempt++ {
		n, err := a.docker.NetworkInspect(ctx, name, network.InspectOptions{})
		switch {
		case err == nil:
			if !isOurs(n.Labels, spec.SandboxID) {
				return "", conflict("network %s exists but is not the network of sandbox %s (labels %v); remove it or pick another sandbox id", name, spec.SandboxID, n.Labels)
			}
			return name, nil
		case !cerrdefs.IsNotFound(err):
			return "", fmt.Errorf("inspect network %s: %w", name, err)
		}
		_, err = a.docker.NetworkCreate(ctx, name, network.CreateOptions{
			Driver: "bridge",
			Labels: a.labels(spec.SandboxID, roleNetwork, spec.Labels),
			// Nothing but the sandbox is on it; say so anyway.
			Options: map[string]string{"com.docker.network.bridge.enable_icc": "false"},
		})
		if err == nil {
			a.log.Info("network created", "sandbox_id", spec.SandboxID, "network", name)
			return name, nil
		}
		if (cerrdefs.IsConflict(err) || strings.Contains(err.Error(), "already exists")) && attempt < 3 {
			continue // an earlier attempt whose answer was lost created it: look again
		}
		if strings.Contains(err.Error(), "address pool") {
			return "", fmt.Errorf("create network %s: %w (every sandbox has a network of its own: raise the Docker daemon's default-address-pools)", name, err)
		}
		return "", fmt.Errorf("create network %s: %w", name, err)
	}
}

// removeSandboxNetwork removes sandbox id's network when it is ours; a
// missing one is fine, someone else's of that name is left alone.
func (a *Activities) removeSandboxNetwork(ctx context.Context, sandboxID string) error {
	name := networkName(sandboxID)
	n, err := a.docker.NetworkInspect(ctx, name, network.InspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect network %s: %w", name, err)
	}
	if !isOurs(n.Labels, sandboxID) {
		a.log.Warn("network of that name is not ours; left alone", "sandbox_id", sandboxID, "network", name)
		return nil
	}
	return a.removeNetwork(ctx, name)
}

// removeNetwork removes a network; a missing one is fine.
func (a *Activities) removeNetwork(ctx context.Context, name string) error {
	var err error
	// A just-removed container can hold its endpoint for a moment.
	for i := 0; i < 10; i++ {
		err = a.docker.NetworkRemove(ctx, name)
		if err == nil || cerrdefs.IsNotFound(err) {
			return nil
		}
		if !cerrdefs.IsConflict(err) && !strings.Contains(err.Error(), "active endpoints") {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("remove network %s: %w", name, err)
}

// listNetworkLeftovers lists the networks labelled as ours (filtered like
// ListLeftovers).
func (a *Activities) listNetworkLeftovers(ctx context.Context, f filters.Args) ([]Leftover, error) {
	ns, err := a.docker.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	var out []Leftover
	for _, n := range ns {
		out = append(out, Leftover{Kind: "network", Name: n.Name, SandboxID: n.Labels[LabelSandboxID]})
	}
	return out, nil
}
