package workflows

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
)

// TestHostRegistryKeepsLastBeats: each host's last beat is kept, beats
// without a name or queue are ignored, a leaving host is not live, and
// after a run's worth of beats the registry continues as new with every
// host it knew.
func TestHostRegistryKeepsLastBeats(t *testing.T) {
	s := &testsuite.WorkflowTestSuite{}
	e := s.NewTestWorkflowEnvironment()
	e.RegisterWorkflowWithOptions(HostRegistryWorkflow, workflow.RegisterOptions{Name: HostRegistryWorkflowName})
	query := func() []HostInfo {
		v, err := e.QueryWorkflow(QueryHosts)
		require.NoError(t, err)
		var out []HostInfo
		require.NoError(t, v.Get(&out))
		return out
	}
	beat := func(after time.Duration, b HostBeat) {
		e.RegisterDelayedCallback(func() { e.SignalWorkflow(SignalHostBeat, b) }, after)
	}
	beat(time.Second, HostBeat{Name: "h2", Queue: "eos-host-h2", Advertise: "10.0.0.2:7443", Sandboxes: 1})
	beat(2*time.Second, HostBeat{Name: "h1", Queue: "eos-host-h1", Advertise: "10.0.0.1:7443"})
	beat(3*time.Second, HostBeat{Queue: "nameless"})
	beat(4*time.Second, HostBeat{Name: "h2", Queue: "eos-host-h2", Advertise: "10.0.0.2:7443", Sandboxes: 3})
	var mid []HostInfo
	e.RegisterDelayedCallback(func() { mid = query() }, 5*time.Second)
	beat(6*time.Second, HostBeat{Name: "h1", Queue: "eos-host-h1", Leaving: true})
	var after []HostInfo
	e.RegisterDelayedCallback(func() { after = query() }, 7*time.Second)
	defer func(n int) { hostRegistryRun = n }(hostRegistryRun)
	hostRegistryRun = 10
	for i := 0; i < hostRegistryRun; i++ {
		beat(8*time.Second+time.Duration(i)*time.Millisecond, HostBeat{Name: "h3", Queue: "eos-host-h3"})
	}
	e.ExecuteWorkflow(HostRegistryWorkflowName, []HostInfo(nil))

	require.Len(t, mid, 2)
	require.Equal(t, "h1", mid[0].Name)
	require.Equal(t, "h2", mid[1].Name)
	require.Equal(t, 3, mid[1].Sandboxes, "the last beat wins")
	require.True(t, mid[1].Live(mid[1].LastSeen.Add(HostStaleAfter/2)))
	require.False(t, mid[1].Live(mid[1].LastSeen.Add(HostStaleAfter)), "a host not heard from for HostStaleAfter is lost")
	require.False(t, after[0].Live(after[0].LastSeen), "a leaving host is lost at once")

	err := e.GetWorkflowError()
	var can *workflow.ContinueAsNewError
	require.ErrorAs(t, err, &can)
	var next []HostInfo
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	names := []string{}
	for _, h := range next {
		names = append(names, h.Name)
	}
	require.Equal(t, []string{"h1", "h2", "h3"}, names)
}
