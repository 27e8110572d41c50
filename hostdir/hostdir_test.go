package hostdir

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/mocks"

	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

func host(name string, seen time.Time) workflows.HostInfo {
	return workflows.HostInfo{HostBeat: workflows.HostBeat{Name: name, Queue: "eos-host-" + name, Advertise: "10.0.0." + name[1:] + ":7443",
		Fingerprint: "ab" + name}, LastSeen: seen}
}

func registryAnswers(t *testing.T, hosts ...workflows.HostInfo) converter.EncodedValue {
	v := mocks.NewEncodedValue(t)
	v.On("Get", mock.Anything).Run(func(a mock.Arguments) { *a.Get(0).(*[]workflows.HostInfo) = hosts }).Return(nil)
	return v
}

// A registry query stuck on a dead worker (its host is the one being lost)
// does not hold up every host check: after QueryPatience a recent answer
// serves; an older one does not, and the registry is asked again with the
// caller's own time.
func TestHostsServeARecentAnswerWhileTheRegistryIsSlow(t *testing.T) {
	stuck := func(a mock.Arguments) { <-a.Get(0).(context.Context).Done() }
	now := time.Now()
	c := mocks.NewClient(t)
	var d Directory
	d.Seed([]workflows.HostInfo{host("h1", now)}, now.Add(-2*time.Second))
	c.On("QueryWorkflow", mock.Anything, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts).Run(stuck).
		Return(nil, serviceerror.NewDeadlineExceeded("sticky worker gone")).Once()
	list, err := d.Hosts(context.Background(), c) // the stuck query ends only by the patience: a wait on it would never end
	require.NoError(t, err)
	require.Len(t, list, 1)

	d.Seed(list, now.Add(-StaleServe-time.Second)) // too old to serve
	c.On("QueryWorkflow", mock.Anything, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts).Run(stuck).
		Return(nil, serviceerror.NewDeadlineExceeded("sticky worker gone")).Once()
	c.On("QueryWorkflow", mock.Anything, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts).
		Return(registryAnswers(t, host("h1", now), host("h2", now)), nil).Once()
	list, err = d.Hosts(context.Background(), c)
	require.NoError(t, err)
	require.Len(t, list, 2, "an old answer is not served: the registry is asked again")

	// The server gives up at the deadline it was sent a moment before the
	// client's own passes: that is the patience run out too, and a recent
	// answer serves (CI once got the server's error back as the answer).
	d.Seed(list, time.Now().Add(-2*time.Second))
	c.On("QueryWorkflow", mock.Anything, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts).
		Return(nil, serviceerror.NewDeadlineExceeded("query timed out before a worker could process it")).Once()
	list, err = d.Hosts(context.Background(), c)
	require.NoError(t, err)
	require.Len(t, list, 2, "the server's own timeout is impatience too")
}

// An answer is reused for CacheFor; a host is found by its queue, in the
// cache too; no registry yet is no host; a forwarder only when the host
// advertises one.
func TestDirectoryFindsHostsByQueue(t *testing.T) {
	now := time.Now()
	c := mocks.NewClient(t)
	var d Directory
	c.On("QueryWorkflow", mock.Anything, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts).
		Return(nil, serviceerror.NewNotFound("no registry")).Once()
	_, found, err := d.Host(context.Background(), c, "eos-host-h1")
	require.NoError(t, err)
	require.False(t, found, "no registry yet: no host")

	d.Seed(nil, time.Time{})
	c.On("QueryWorkflow", mock.Anything, workflows.HostRegistryWorkflowID, "", workflows.QueryHosts).
		Return(registryAnswers(t, host("h1", now), host("h2", now)), nil).Once()
	h, found, err := d.Host(context.Background(), c, "eos-host-h2")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "h2", h.Name)
	h, found, err = d.Host(context.Background(), c, "eos-host-h1") // from the cache: the mock answers once
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, &daemonclient.Via{Addr: "10.0.0.1:7443", Fingerprint: "abh1"}, Via(h))
	_, found, _ = d.Host(context.Background(), c, "eos-host-h3")
	require.False(t, found)
	cached, ok := d.Cached("eos-host-h2")
	require.True(t, ok)
	require.Equal(t, "h2", cached.Name)

	h.Advertise = ""
	require.Nil(t, Via(h), "a host without a forwarder")
}
