package activities

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/hostlink"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// registry answers the host registry's query with hosts.
type registry struct{ hosts []workflows.HostInfo }

func (r *registry) QueryWorkflow(context.Context, string, string, string, ...interface{}) (converter.EncodedValue, error) {
	return hostsValue(r.hosts), nil
}

type hostsValue []workflows.HostInfo

func (v hostsValue) HasValue() bool { return true }
func (v hostsValue) Get(ptr interface{}) error {
	b, err := json.Marshal([]workflows.HostInfo(v))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, ptr)
}

// A local daemon call of a sandbox's workflow that runs on a worker of
// another host than the sandbox's goes through that host's forwarder (a
// real hostlink server here): the daemon's answers, its refusals included,
// are the call's. Anything that is not the daemon's answer — no registry,
// no such host, a host that is not live, a forwarder that cannot find the
// sandbox or cannot be reached — fails the call in a way the workflow
// takes for "not answered" (not_here, or a plain error), so it calls the
// daemon on the host's queue instead.
func TestCallDaemonHereReachesAnotherHostThroughItsForwarder(t *testing.T) {
	fd := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/rpc/create_workspace_session":
			_, _ = io.WriteString(w, `{"workspace_session_id":"ws-1"}`)
		default:
			writeEnvelope(w, http.StatusConflict, api.KindOperationFailed, "conflicting paths", map[string]any{"conflicts": []any{"f.txt"}})
		}
	})
	cert, err := hostlink.LoadOrCreateCert(t.TempDir(), []string{"127.0.0.1"})
	require.NoError(t, err)
	srv := &hostlink.Server{Secret: testSecret, Host: "h2", Lookup: func(_ context.Context, id string) (api.Endpoint, error) {
		if id != "sbx1" {
			return api.Endpoint{}, api.Errorf(api.KindNotFound, map[string]any{"sandbox_id": id}, "sandbox %s is not one of this host's", id)
		}
		return fd.endpoint(t), nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, _, err := hostlink.Listen(ctx, "127.0.0.1:0", cert, srv)
	require.NoError(t, err)
	h2 := workflows.HostInfo{HostBeat: workflows.HostBeat{Name: "h2", Queue: "eos-host-h2", Advertise: addr.String(), Fingerprint: cert.Fingerprint},
		LastSeen: time.Now()}

	acts := newTestActivities(t, newFakeDocker())
	SetHostQueue(acts, "eos-host-h1")
	call := func(id, op string) (json.RawMessage, error) {
		return acts.CallDaemonHere(context.Background(), workflows.DaemonCall{SandboxID: id, HostQueue: "eos-host-h2",
			Daemon: api.Endpoint{Host: "127.0.0.1", Port: 1}, Op: op, RequestID: "req-9"})
	}
	notHere := func(err error) {
		t.Helper()
		var ae *temporal.ApplicationError
		require.True(t, errors.As(err, &ae), "%v", err)
		require.Equal(t, workflows.ErrTypeNotHere, ae.Type(), "%v", err)
	}
	notAnswered := func(err error) {
		t.Helper()
		require.Error(t, err)
		var ae *temporal.ApplicationError
		require.False(t, errors.As(err, &ae), "not an answer of the daemon: %v", err)
	}

	_, err = call("sbx1", "create_workspace_session")
	notHere(err) // this worker knows no registry
	require.Zero(t, fd.calls.Load())

	SetHostRegistry(acts, &registry{hosts: []workflows.HostInfo{h2}})
	out, err := call("sbx1", "create_workspace_session")
	require.NoError(t, err)
	require.JSONEq(t, `{"workspace_session_id":"ws-1"}`, string(out))
	require.Equal(t, "req-9", fd.last.Load().Header.Get("X-Request-Id"))

	_, err = call("sbx1", "publish_workspace_session")
	requireAppError(t, err, api.KindOperationFailed, true) // the daemon's refusal is the answer

	calls := fd.calls.Load()
	_, err = call("sbx-elsewhere", "create_workspace_session")
	notAnswered(err) // the forwarder's own not_found is not the daemon's
	require.Contains(t, err.Error(), "not one of this host's")

	acts.hosts.Seed([]workflows.HostInfo{h2, {HostBeat: workflows.HostBeat{Name: "h3", Queue: "eos-host-h3", Advertise: "127.0.0.1:1",
		Fingerprint: cert.Fingerprint}, LastSeen: time.Now().Add(-time.Hour)}}, time.Now())
	_, err = acts.CallDaemonHere(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", HostQueue: "eos-host-h3", Op: "create_workspace_session"})
	notHere(err) // h3 is not live
	_, err = acts.CallDaemonHere(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", HostQueue: "eos-host-h4", Op: "create_workspace_session"})
	notHere(err) // no such host

	cancel() // the forwarder goes away: its address refuses dials
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr.String())
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, 20*time.Millisecond)
	// The first call fails unanswered (a kept-alive connection may go
	// first, then the dial), and once a dial was refused the forwarder is
	// not dialled again for a while: the host's queue serves the calls.
	var ae *temporal.ApplicationError
	for i := 0; ; i++ {
		require.Less(t, i, 3, "the refused dial is remembered")
		_, err = call("sbx1", "create_workspace_session")
		if errors.As(err, &ae) {
			break
		}
		notAnswered(err)
	}
	notHere(err)
	require.Contains(t, err.Error(), "could not reach the forwarder of host h2")
	require.Equal(t, calls, fd.calls.Load(), "nothing reached the daemon but the calls it answered")
}
