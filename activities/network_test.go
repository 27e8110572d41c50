package activities

import (
	"context"
	"testing"

	"github.com/docker/docker/api/types/network"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// The sandbox's network is created once and adopted on a repeated create;
// a network of that name that is not ours is a non-retryable conflict and
// no container is created on it.
func TestCreateContainerNetwork(t *testing.T) {
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	ctx := context.Background()
	_, err := acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	_, err = acts.CreateContainer(ctx, testSpec("sbx1"))
	require.NoError(t, err)
	require.Len(t, d.networks, 1, "adopted, not created twice")

	d.networks["eos-net-sbx2"] = network.CreateOptions{Driver: "bridge", Labels: map[string]string{"someone": "else"}}
	_, err = acts.CreateContainer(ctx, testSpec("sbx2"))
	requireAppError(t, err, api.KindInvalidRequest, true)
	require.Contains(t, err.Error(), "not the network of sandbox sbx2")
	for _, c := range d.creates {
		require.NotEqual(t, "eos-sbx-sbx2", c.name)
	}

	// Removing a sandbox removes its network even when the container is
	// already gone.
	delete(d.containers, "eos-sbx-sbx1")
	require.NoError(t, acts.RemoveSandbox(ctx, "sbx1"))
	require.NotContains(t, d.networks, "eos-net-sbx1")
	require.NoError(t, acts.RemoveSandbox(ctx, "sbx2"))
	require.Contains(t, d.networks, "eos-net-sbx2", "not ours: left alone")
}
