package activities

import (
	"context"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestLocalDaemonAndCount: the forwarder's lookup answers only for a
// running sandbox container of this deployment; the heartbeat counts only
// this deployment's sandbox containers.
func TestLocalDaemonAndCount(t *testing.T) {
	ctx := context.Background()
	d := newFakeDocker()
	a := newTestActivities(t, d)
	SetOwner(a, "cluster-1", "default")
	mk := func(id string, labels map[string]string) {
		cfg := &container.Config{Image: "img:1", Labels: labels}
		_, err := d.ContainerCreate(ctx, cfg, &container.HostConfig{}, nil, nil, workflows.ContainerName(id))
		require.NoError(t, err)
	}
	mk("eos-ours", a.labels("eos-ours", roleSandbox, nil))
	mk("eos-stopped", a.labels("eos-stopped", roleSandbox, nil))
	other := a.labels("eos-theirs", roleSandbox, nil)
	other[LabelCluster] = "cluster-2"
	mk("eos-theirs", other)
	mk("eos-plain", map[string]string{"app": "x"}) // not ours at all
	require.NoError(t, d.ContainerStart(ctx, workflows.ContainerName("eos-ours"), container.StartOptions{}))
	require.NoError(t, d.ContainerStart(ctx, workflows.ContainerName("eos-theirs"), container.StartOptions{}))

	ep, err := LocalDaemon(ctx, a, "eos-ours")
	require.NoError(t, err)
	require.Equal(t, api.Endpoint{Host: "127.0.0.1", Port: 49153}, ep)

	for id, kind := range map[string]string{"eos-theirs": api.KindNotFound, "eos-plain": api.KindNotFound, "eos-missing": api.KindNotFound,
		"eos-stopped": api.KindOperationFailed, "../etc": api.KindInvalidRequest} {
		_, err := LocalDaemon(ctx, a, id)
		var ae *api.Error
		require.ErrorAs(t, err, &ae, id)
		require.Equal(t, kind, ae.Kind, "%s: %s", id, ae.Message)
	}

	n, err := CountSandboxes(ctx, a)
	require.NoError(t, err)
	require.Equal(t, 2, n, "ours, running or not; not another deployment's, not foreign containers")
}
