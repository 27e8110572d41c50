package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// clusterBackend is a gateway without workers of its own whose registry
// answer is given (cached, so no Temporal is asked).
func clusterBackend(hosts ...workflows.HostInfo) *TemporalBackend {
	b := &TemporalBackend{}
	b.hostDir.Seed(hosts, time.Now().Add(time.Hour))
	return b
}

func host(name string, sandboxes int, seen time.Time) workflows.HostInfo {
	return workflows.HostInfo{HostBeat: workflows.HostBeat{Name: name, Queue: "eos-host-" + name, Advertise: "10.0.0." + name[1:] + ":7443",
		Fingerprint: "ab" + name, Sandboxes: sandboxes}, LastSeen: seen}
}

func requireKind(t *testing.T, err error, kind string) *api.Error {
	t.Helper()
	e, ok := err.(*api.Error)
	require.Truef(t, ok, "want *api.Error, got %v", err)
	require.Equal(t, kind, e.Kind, e.Message)
	return e
}

func TestPlacement(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	lost := host("h3", 0, now.Add(-2*workflows.HostStaleAfter))
	b := clusterBackend(host("h1", 2, now), host("h2", 0, now), lost)

	q, err := b.place(ctx, "h1", true)
	require.NoError(t, err)
	require.Equal(t, "eos-host-h1", q, "a named host gets it")

	e := requireKind(t, ignore(b.place(ctx, "h9", true)), api.KindInvalidRequest)
	require.Equal(t, []string{"h1", "h2", "h3"}, e.Details["hosts"], "an unknown host is refused with the known ones")
	requireKind(t, ignore(b.place(ctx, "../h1", true)), api.KindInvalidRequest)
	e = requireKind(t, ignore(b.place(ctx, "h3", true)), api.KindOperationFailed)
	require.Equal(t, "unavailable", e.Details["availability"], "a lost host takes nothing")

	// Least loaded, counting what this gateway placed since each host's
	// beat: h2 (0) twice, then h1 and h2 are even (2, 2).
	var got []string
	for range 4 {
		q, err := b.place(ctx, "", true)
		require.NoError(t, err)
		got = append(got, q)
	}
	require.Equal(t, []string{"eos-host-h2", "eos-host-h2", "eos-host-h1", "eos-host-h2"}, got)
	// A read placed without reserving changes no count.
	q1, _ := b.place(ctx, "", false)
	q2, _ := b.place(ctx, "", false)
	require.Equal(t, q1, q2)

	// No live host at all: refused; no host registered: the old single
	// queue.
	requireKind(t, ignore(clusterBackend(lost).place(ctx, "", true)), api.KindOperationFailed)
	none := clusterBackend()
	none.HostQueue = "eos-host-x"
	q, err = none.place(ctx, "", true)
	require.NoError(t, err)
	require.Equal(t, "eos-host-x", q)
	// A gateway with its own workers keeps new sandboxes on them.
	own := clusterBackend(host("h1", 0, now))
	own.HostQueue, own.LocalQueue = "eos-host-me", "eos-host-me"
	q, err = own.place(ctx, "", true)
	require.NoError(t, err)
	require.Equal(t, "eos-host-me", q)
}

func TestDaemonRoute(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	b := clusterBackend(host("h1", 0, now), host("h2", 0, now.Add(-2*workflows.HostStaleAfter)))
	b.rememberQueue("eos-a", "eos-host-h1")
	b.rememberQueue("eos-b", "eos-host-h2")
	b.rememberQueue("eos-c", "eos-host-unregistered")
	b.rememberQueue("eos-d", "")

	v, err := b.via(ctx, "eos-a")
	require.NoError(t, err)
	require.Equal(t, &daemonclient.Via{Addr: "10.0.0.1:7443", Fingerprint: "abh1"}, v, "a live remote host: through its forwarder")

	_, err = b.via(ctx, "eos-b")
	e := requireKind(t, err, api.KindOperationFailed)
	require.Equal(t, map[string]any{"host": "h2", "availability": "unavailable", "sandbox_id": "eos-b",
		"last_seen": now.Add(-2 * workflows.HostStaleAfter).UTC().Format(time.RFC3339Nano)}, e.Details)
	require.Equal(t, e, b.checkHost(ctx, "eos-b"), "lifecycle ops on a lost host are refused at once")
	rec := b.recordWith(&workflows.SandboxState{SandboxID: "eos-b", Phase: workflows.PhaseReady, HostQueue: "eos-host-h2"}, nil)
	require.Equal(t, "h2", rec["host"])
	require.Equal(t, "unavailable", rec["availability"], "the record says so")

	for _, id := range []string{"eos-c", "eos-d"} {
		v, err := b.via(ctx, id)
		require.NoError(t, err)
		require.Nil(t, v, "%s: not a registered host: this machine, dialled directly", id)
	}
	// With workers of its own, its own queue is local.
	b.LocalQueue = "eos-host-h1"
	v, err = b.via(ctx, "eos-a")
	require.NoError(t, err)
	require.Nil(t, v)
	require.NoError(t, b.checkHost(ctx, "eos-b"), "only a gateway without workers refuses up front")
}

func ignore(_ string, err error) error { return err }

// TestOrphanQueues: an orphan operation asks the named host, else every
// live host and the gateway's own workers once each — never a lost host —
// and with no host registered the one default queue.
func TestOrphanQueues(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	b := clusterBackend(host("h1", 2, now), host("h2", 0, now), host("h3", 0, now.Add(-2*workflows.HostStaleAfter)))
	qs, err := b.orphanQueues(ctx, "")
	require.NoError(t, err)
	require.Equal(t, []hostQueue{{"h1", "eos-host-h1"}, {"h2", "eos-host-h2"}}, qs)
	qs, err = b.orphanQueues(ctx, "h2")
	require.NoError(t, err)
	require.Equal(t, []hostQueue{{"h2", "eos-host-h2"}}, qs)
	_, err = b.orphanQueues(ctx, "h3")
	requireKind(t, err, api.KindOperationFailed)
	_, err = b.orphanQueues(ctx, "../h1")
	requireKind(t, err, api.KindInvalidRequest)

	own := clusterBackend(host("h1", 0, now))
	own.HostQueue, own.LocalQueue, own.LocalName = "eos-host-h1", "eos-host-h1", "h1"
	qs, err = own.orphanQueues(ctx, "")
	require.NoError(t, err)
	require.Equal(t, []hostQueue{{"h1", "eos-host-h1"}}, qs, "the gateway's own host is asked once")

	none := clusterBackend()
	none.HostQueue = "eos-host-x"
	qs, err = none.orphanQueues(ctx, "")
	require.NoError(t, err)
	require.Equal(t, []hostQueue{{"", "eos-host-x"}}, qs)
}

// registryDown is a Temporal client whose host registry does not answer.
type registryDown struct{ tclient.Client }

func (registryDown) QueryWorkflow(context.Context, string, string, string, ...interface{}) (converter.EncodedValue, error) {
	return nil, errors.New("connection refused")
}

// An operation on a remote host is watched for the host's loss even when
// the host could not be looked up as it started (the registry not
// answering, as right after a host's worker died): once the host is
// known lost it answers unavailable, not after its own timeout. A host
// already known lost is refused before the operation starts.
func TestWhileHostLiveWatchesThroughALookupError(t *testing.T) {
	now := time.Now()
	b := &TemporalBackend{Client: registryDown{}}
	b.rememberQueue("eos-1", "eos-host-h1")
	b.hostDir.Seed([]workflows.HostInfo{host("h1", 1, now)}, now.Add(-time.Hour)) // too old to serve: asked again, fails
	started := make(chan struct{})
	go func() {
		<-started
		// The registry answers again, and h1 has not beaten for long.
		b.hostDir.Seed([]workflows.HostInfo{host("h1", 1, now.Add(-2*workflows.HostStaleAfter))}, time.Now().Add(time.Hour))
	}()
	err := b.whileHostLive(context.Background(), "eos-1", func(ctx context.Context) error {
		close(started)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Second):
			return errors.New("ran unwatched until its own timeout")
		}
	})
	var lost errHostLost
	require.ErrorAs(t, err, &lost, "%v", err)
	e := requireKind(t, lost.error, api.KindOperationFailed)
	require.Equal(t, "unavailable", e.Details["availability"])

	ran := false
	err = b.whileHostLive(context.Background(), "eos-1", func(context.Context) error { ran = true; return nil })
	require.False(t, ran, "nothing is sent to a host known lost")
	require.Equal(t, "unavailable", requireKind(t, err, api.KindOperationFailed).Details["availability"])
}
