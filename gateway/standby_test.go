package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/mocks"

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
	// One that refused its claim and waits on comes back, unless another
	// took its place.
	require.True(t, p.giveBack(k, "eos-1"))
	require.False(t, p.giveBack(k, "eos-0"), "the pool holds one standby of a key")
	require.Equal(t, "eos-1", p.take(k))
	// Dropping the standbys of images (the bench's cold create) keeps the
	// spare; closing takes it too.
	spare := standbyKey{queue: "q"}
	p.ids[k], p.ids[spare] = "eos-2", "eos-spare"
	require.Equal(t, []string{"eos-2"}, p.takeAll(false, false))
	require.Equal(t, map[standbyKey]string{spare: "eos-spare"}, p.ids)
	p.ids[k] = "eos-3"
	require.ElementsMatch(t, []string{"eos-3", "eos-spare"}, p.takeAll(true, true))
	b.refillStandby(k) // off: nothing starts
	b.Standby.Enabled = true
	b.refillStandby(k) // closed: nothing starts
	require.False(t, b.StandbyPending())
	require.False(t, p.giveBack(k, "eos-4"), "a closed pool takes nothing back")
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
	// A spare has no container: the host's count does not include it, so
	// it takes nothing off the host's load.
	b.pool().ids[standbyKey{queue: "eos-host-h2"}] = "eos-spare"
	q, err = b.place(context.Background(), "", false)
	require.NoError(t, err)
	require.Equal(t, "eos-host-h1", q, "h2 still runs two sandboxes")
}

// A restarted gateway takes back the standby its killed run left even when
// the standby's state cannot be read at first (its workflow waits for a
// worker to replay it): it asks again. Another gateway's standby and one
// already claimed are left alone, and are not even asked.
func TestAdoptStandbysAsksAgain(t *testing.T) {
	c := mocks.NewClient(t)
	b := &TemporalBackend{Client: c, Standby: StandbyOptions{Enabled: true, Owner: "me", AdoptPatience: time.Minute}}
	c.On("ListWorkflow", mock.Anything, mock.Anything).Return(&workflowservice.ListWorkflowExecutionsResponse{Executions: []*workflowpb.WorkflowExecutionInfo{
		runningSandbox(t, "eos-mine", map[string]any{workflows.MemoStandby: true, "image": "img", memoStandbyOwner: "me"}),
		runningSandbox(t, "eos-theirs", map[string]any{workflows.MemoStandby: true, "image": "img", memoStandbyOwner: "them"}),
		runningSandbox(t, "eos-claimed", map[string]any{workflows.MemoStandby: false, "image": "img", memoStandbyOwner: "me"}),
	}}, nil)
	q := c.On("QueryWorkflow", mock.Anything, workflows.SandboxWorkflowID("eos-mine"), "", workflows.QueryState)
	q.Return(nil, serviceerror.NewDeadlineExceeded("no worker yet")).Twice()
	v := mocks.NewEncodedValue(t)
	v.On("Get", mock.Anything).Run(func(a mock.Arguments) {
		*a.Get(0).(*workflows.SandboxState) = workflows.SandboxState{SandboxID: "eos-mine", Phase: workflows.PhaseCreating, Standby: true, HostQueue: "q"}
	}).Return(nil)
	c.On("QueryWorkflow", mock.Anything, workflows.SandboxWorkflowID("eos-mine"), "", workflows.QueryState).Return(v, nil).Once()

	require.NoError(t, b.AdoptStandbys(context.Background()))
	require.Equal(t, map[standbyKey]string{{image: "img", queue: "q"}: "eos-mine"}, b.pool().ids)
	c.AssertNumberOfCalls(t, "QueryWorkflow", 3)
}

// A spare that a killed gateway's create had claimed, still checking the
// claim's image when the new gateway starts, is asked again rather than
// taken for a spare: here the claim took it, and the pool stays empty (so
// the gateway starts a spare of its own).
func TestAdoptStandbysWaitsOutAClaimCheck(t *testing.T) {
	c := mocks.NewClient(t)
	b := &TemporalBackend{Client: c, Standby: StandbyOptions{Enabled: true, Owner: "me", AdoptPatience: time.Minute}}
	c.On("ListWorkflow", mock.Anything, mock.Anything).Return(&workflowservice.ListWorkflowExecutionsResponse{Executions: []*workflowpb.WorkflowExecutionInfo{
		runningSandbox(t, "eos-spare", map[string]any{workflows.MemoStandby: true, "image": "", memoStandbyOwner: "me"}),
	}}, nil)
	state := func(st workflows.SandboxState) *mocks.Value {
		v := mocks.NewEncodedValue(t)
		v.On("Get", mock.Anything).Run(func(a mock.Arguments) { *a.Get(0).(*workflows.SandboxState) = st }).Return(nil)
		return v
	}
	q := workflows.SandboxWorkflowID("eos-spare")
	c.On("QueryWorkflow", mock.Anything, q, "", workflows.QueryState).
		Return(state(workflows.SandboxState{SandboxID: "eos-spare", Phase: workflows.PhaseStandby, Standby: true, Claiming: true, HostQueue: "q"}), nil).Once()
	c.On("QueryWorkflow", mock.Anything, q, "", workflows.QueryState).
		Return(state(workflows.SandboxState{SandboxID: "eos-spare", Phase: workflows.PhaseCreating, HostQueue: "q"}), nil).Once()

	require.NoError(t, b.AdoptStandbys(context.Background()))
	require.Empty(t, b.pool().ids, "a claimed spare is no one's spare")
	c.AssertNumberOfCalls(t, "QueryWorkflow", 2)
}

// muteStandby is a backend of owner "me" whose only standby, eos-mute
// (image img on queue q), does not answer its state query until answers
// is set; late adoption is asked every 50 ms.
func muteStandby(t *testing.T, patience time.Duration) (*mocks.Client, *TemporalBackend, *atomic.Bool) {
	old := adoptLateEvery
	t.Cleanup(func() { adoptLateEvery = old })
	adoptLateEvery = 50 * time.Millisecond
	c := mocks.NewClient(t)
	b := &TemporalBackend{Client: c, Standby: StandbyOptions{Enabled: true, Owner: "me", AdoptPatience: patience}}
	c.On("ListWorkflow", mock.Anything, mock.Anything).Return(&workflowservice.ListWorkflowExecutionsResponse{Executions: []*workflowpb.WorkflowExecutionInfo{
		runningSandbox(t, "eos-mute", map[string]any{workflows.MemoStandby: true, "image": "img", memoStandbyOwner: "me"})}}, nil)
	answers := new(atomic.Bool)
	v := mocks.NewEncodedValue(t)
	v.On("Get", mock.Anything).Run(func(a mock.Arguments) {
		*a.Get(0).(*workflows.SandboxState) = workflows.SandboxState{SandboxID: "eos-mute", Phase: workflows.PhaseStandby, Standby: true, HostQueue: "q"}
	}).Return(nil)
	c.On("QueryWorkflow", mock.Anything, mock.Anything, "", workflows.QueryState).Return(
		func(context.Context, string, string, string, ...interface{}) (converter.EncodedValue, error) {
			if !answers.Load() {
				return nil, serviceerror.NewDeadlineExceeded("no worker")
			}
			return v, nil
		})
	return c, b, answers
}

// A standby that does not answer within the patience is reported by name
// and asked again in the background: when it answers it is adopted (the
// pool has none of its image and host), not left running outside the pool
// until its TTL.
func TestAdoptStandbysAdoptsLate(t *testing.T) {
	_, b, answers := muteStandby(t, 500*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := b.AdoptStandbys(ctx)
	require.ErrorContains(t, err, "eos-mute")
	require.Empty(t, b.ids(), "not taken before it answers")
	answers.Store(true)
	require.Eventually(t, func() bool { return len(b.ids()) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, map[standbyKey]string{{image: "img", queue: "q"}: "eos-mute"}, b.ids())
}

// A standby that answers late when the pool already has one of its image
// and host is released, and the pool's stays.
func TestAdoptStandbysReleasesALateOneThePoolHas(t *testing.T) {
	c, b, answers := muteStandby(t, 300*time.Millisecond)
	released := make(chan string, 1)
	h := mocks.NewWorkflowUpdateHandle(t)
	h.On("Get", mock.Anything, mock.Anything).Return(nil).Maybe()
	c.On("UpdateWorkflow", mock.Anything, mock.MatchedBy(func(o client.UpdateWorkflowOptions) bool {
		return o.UpdateName == workflows.UpdateRelease
	})).Run(func(a mock.Arguments) {
		released <- a.Get(1).(client.UpdateWorkflowOptions).WorkflowID
	}).Return(h, nil).Once()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.ErrorContains(t, b.AdoptStandbys(ctx), "eos-mute")
	p := b.pool() // meanwhile the pool started its own
	p.mu.Lock()
	p.ids[standbyKey{image: "img", queue: "q"}] = "eos-new"
	p.mu.Unlock()
	answers.Store(true)
	select {
	case id := <-released:
		require.Equal(t, workflows.SandboxWorkflowID("eos-mute"), id)
	case <-time.After(5 * time.Second):
		t.Fatal("the late standby was not released")
	}
	require.Equal(t, map[standbyKey]string{{image: "img", queue: "q"}: "eos-new"}, b.ids())
}

// ids is the pool's standbys by image and host, read under its lock.
func (b *TemporalBackend) ids() map[standbyKey]string {
	p := b.pool()
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.ids)
}

// runningSandbox is a running sandbox workflow as visibility lists it.
func runningSandbox(t *testing.T, id string, memo map[string]any) *workflowpb.WorkflowExecutionInfo {
	fields := map[string]*commonpb.Payload{}
	for k, v := range memo {
		p, err := converter.GetDefaultDataConverter().ToPayload(v)
		require.NoError(t, err)
		fields[k] = p
	}
	return &workflowpb.WorkflowExecutionInfo{Execution: &commonpb.WorkflowExecution{WorkflowId: workflows.SandboxWorkflowID(id)},
		Status: enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, Memo: &commonpb.Memo{Fields: fields}}
}
