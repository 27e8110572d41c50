package gateway

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// Only a claim that did not take the standby falls back to a plain
// create; a failure of the claimed sandbox's import is the create's.
func TestStandbyUnusable(t *testing.T) {
	require.True(t, standbyUnusable(apperr.Newf(workflows.KindStandbyUnavailable, nil, "taken")))
	require.True(t, standbyUnusable(fmt.Errorf("update: %w", apperr.Newf(workflows.KindStandbyUnavailable, nil, "ended"))))
	require.True(t, standbyUnusable(serviceerror.NewNotFound("workflow not found")))
	require.False(t, standbyUnusable(apperr.Newf(api.KindInvalidRequest, nil, "workspace too large")))
	require.False(t, standbyUnusable(errors.New("context deadline exceeded")))
}

func TestStandbyPoolTakesOnce(t *testing.T) {
	b := &TemporalBackend{}
	k := standbyKey{image: "img", queue: "q"}
	p := b.pool()
	p.ids[k] = "eos-1"
	require.Equal(t, "eos-1", p.take(k))
	require.Empty(t, p.take(k), "a standby is handed out once")
	p.ids[k] = "eos-2"
	require.Equal(t, []string{"eos-2"}, p.takeAll(true))
	b.refillStandby(k) // off: nothing starts
	b.Standby.Enabled = true
	b.refillStandby(k) // closed: nothing starts
	require.False(t, b.StandbyPending())
	require.Empty(t, p.ids)
}

// A host's standby is no one's load: placement does not steer creates
// away from the host that holds the standby they would claim.
func TestPlacementLeavesStandbysOut(t *testing.T) {
	now := time.Now()
	b := clusterBackend(host("h2", 2, now), host("h1", 2, now))
	b.pool().ids[standbyKey{image: "img", queue: "eos-host-h1"}] = "eos-sb"
	q, err := b.place(context.Background(), "", false)
	require.NoError(t, err)
	require.Equal(t, "eos-host-h1", q, "h1 runs one sandbox and a standby, h2 two sandboxes")
}
