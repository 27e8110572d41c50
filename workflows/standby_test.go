package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// standbySpec is what a standby is started with: its id and image only.
var standbySpec = SandboxSpec{SandboxID: "sb1", Image: "img"}

var claim = ClaimRequest{Image: "img", WorkspaceRoot: "/src", SessionTTL: time.Hour, SandboxTTL: 24 * time.Hour,
	Memo: map[string]any{"workspace_root": "/src", "request_id": "r-1"}}

// standbySteps mocks a standby's creation; build delays CreateContainer.
func (e *env) standbySteps(build time.Duration) {
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(nil)
	e.OnActivity(acts.CreateContainer, mock.Anything, standbySpec).After(build).Return(ContainerInfo{Name: "eos-sbx-sb1"}, nil)
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: daemonEP}, nil)
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil)
	e.OnActivity(acts.ResolveDaemon, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: daemonEP, State: "running"}, nil).Maybe()
}

// removals counts RemoveSandbox calls.
func (e *env) removals() *int {
	n := new(int)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(func(context.Context, string) error { *n++; return nil })
	return n
}

// expiresUnclaimed runs a standby of spec that no claim reaches: it ends
// stopped, cleanly, when its TTL passes, having removed what it made once
// (removed counts RemoveSandbox).
func (e *env) expiresUnclaimed(spec SandboxSpec, removed *int) {
	e.t.Helper()
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec, Standby: true, StandbyTTL: 5 * time.Minute})
	require.True(e.t, e.IsWorkflowCompleted())
	require.NoError(e.t, e.GetWorkflowError(), "an unclaimed standby ends cleanly")
	var res SandboxResult
	require.NoError(e.t, e.GetWorkflowResult(&res))
	require.Equal(e.t, PhaseStopped, res.Phase)
	require.Equal(e.t, 1, *removed, "the expired standby removed what it made, once")
}

func TestStandbyIsClaimedOnceAndServes(t *testing.T) {
	e := newEnv(t)
	e.standbySteps(0)
	e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, nil).Once()
	e.daemon(okDaemon)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
	var standbyAt time.Time
	e.RegisterDelayedCallback(func() {
		st := e.state()
		standbyAt = st.Created
		require.Equal(t, PhaseStandby, st.Phase)
		require.True(t, st.Standby)
		require.Empty(t, st.BaseID)
	}, 30*time.Second)
	e.script(time.Minute, append([]step{
		step{name: UpdateCreateSession, args: []any{CreateSessionRequest{Agent: "a"}}, check: func(_ json.RawMessage, err error) {
			require.Error(t, err, "an unclaimed standby serves no session")
		}},
		step{name: UpdateClaim, args: []any{claim}, check: func(out json.RawMessage, err error) {
			st := readyAfterClaim(t, out, err)
			require.Equal(t, "abc123", st.GitHead)
			require.Equal(t, time.Hour, st.Lifecycle.SessionIdleTTL)
			require.Equal(t, 24*time.Hour, st.Lifecycle.TTL)
			require.NotNil(t, st.Lifecycle.ExpiresAt)
			require.Equal(t, st.Created.Add(24*time.Hour), *st.Lifecycle.ExpiresAt, "the TTL counts from the claim")
			require.True(t, st.Created.After(standbyAt), "created when claimed: %v, standby since %v", st.Created, standbyAt)
		}},
	}, claimedOnceServes(t, "a standby")...)...)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true, StandbyTTL: time.Hour})
	require.True(t, e.IsWorkflowCompleted())
	require.NoError(t, e.GetWorkflowError())
	var res SandboxResult
	require.NoError(t, e.GetWorkflowResult(&res))
	require.Equal(t, PhaseStopped, res.Phase)
	e.AssertExpectations(t)
}

func TestStandbyRefusesBadClaimsThenExpires(t *testing.T) {
	e := newEnv(t)
	e.standbySteps(0)
	removed := e.removals()
	bad := func(mut func(*ClaimRequest), kind string) step {
		r := claim
		mut(&r)
		return step{name: UpdateClaim, args: []any{r}, check: func(_ json.RawMessage, err error) {
			require.Error(t, err)
			require.Equal(t, kind, kindOf(t, err).Kind, "%+v", r)
		}, then: func() {
			st := e.state()
			require.Equal(t, PhaseStandby, st.Phase, "a refused claim changes nothing")
			require.True(t, st.Standby)
		}}
	}
	e.script(time.Minute,
		bad(func(r *ClaimRequest) { r.Image = "other" }, KindStandbyUnavailable),
		bad(func(r *ClaimRequest) { r.WorkspaceRoot = "" }, api.KindInvalidRequest),
		bad(func(r *ClaimRequest) { r.WorkspaceRoot = "src" }, api.KindInvalidRequest),
		bad(func(r *ClaimRequest) { r.WorkspaceRoot = "/src/../etc" }, api.KindInvalidRequest),
		bad(func(r *ClaimRequest) { r.SandboxTTL = -time.Second }, api.KindInvalidRequest),
	)
	e.expiresUnclaimed(standbySpec, removed)
	e.AssertNotCalled(t, "ImportWorkspace", mock.Anything, mock.Anything)
}

func TestStandbyDestroyedRemovesOnce(t *testing.T) {
	e := newEnv(t)
	e.standbySteps(0)
	removed := e.removals()
	e.script(time.Minute, step{name: UpdateDestroy, check: ok(t)})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, 1, *removed)
}

// A claim that arrives while the standby is still being made waits for it.
func TestStandbyClaimedWhileBuilding(t *testing.T) {
	e := newEnv(t)
	e.standbySteps(time.Minute)
	e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, nil).Once()
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
	e.script(time.Second,
		step{name: UpdateClaim, args: []any{claim}, check: func(out json.RawMessage, err error) {
			require.NoError(t, err)
			require.Contains(t, string(out), `"state":"ready"`)
		}},
		step{name: UpdateDestroy, check: ok(t)},
	)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true})
	require.NoError(t, e.GetWorkflowError())
	e.AssertExpectations(t)
}

// A standby that fails to start answers its pending claim "unavailable"
// (the gateway then creates the usual way), and removes what it made.
func TestStandbyFailedBeforeTheClaim(t *testing.T) {
	e := newEnv(t)
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(nil)
	e.OnActivity(acts.CreateContainer, mock.Anything, standbySpec).After(time.Minute).Return(ContainerInfo{},
		temporal.NewNonRetryableApplicationError("no space", api.KindInternal, nil))
	removed := e.removals()
	e.script(time.Second, step{name: UpdateClaim, args: []any{claim}, check: func(_ json.RawMessage, err error) {
		require.Error(t, err)
		require.Equal(t, KindStandbyUnavailable, kindOf(t, err).Kind)
	}})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true})
	require.Error(t, e.GetWorkflowError())
	require.Equal(t, 1, *removed)
}

// A claimed standby whose import fails fails as a create would, with the
// import's error, and removes what it made.
func TestStandbyClaimImportFails(t *testing.T) {
	e := newEnv(t)
	e.standbySteps(0)
	e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(ImportWorkspaceResult{},
		temporal.NewNonRetryableApplicationError("workspace too large", api.KindInvalidRequest, nil))
	removed := e.removals()
	e.script(time.Minute, step{name: UpdateClaim, args: []any{claim}, check: func(_ json.RawMessage, err error) {
		require.Error(t, err)
		require.Equal(t, api.KindInvalidRequest, kindOf(t, err).Kind)
		require.Contains(t, err.Error(), "workspace too large")
	}})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true})
	require.Error(t, e.GetWorkflowError())
	require.Equal(t, 1, *removed)
}

// A standby whose container stopped while it waited is not handed out:
// the claim answers "unavailable" (the gateway creates anew) and the
// standby removes what it made.
func TestStandbyNotRunningIsNotClaimed(t *testing.T) {
	e := newEnv(t)
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(nil)
	e.OnActivity(acts.CreateContainer, mock.Anything, standbySpec).Return(ContainerInfo{Name: "eos-sbx-sb1"}, nil)
	e.OnActivity(acts.StartContainer, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: daemonEP}, nil)
	e.OnActivity(acts.WaitReady, mock.Anything, "sb1", daemonEP).Return(nil)
	e.OnActivity(acts.ResolveDaemon, mock.Anything, "sb1").Return(ContainerInfo{Name: "eos-sbx-sb1", Daemon: daemonEP, State: "exited"}, nil).Once()
	removed := e.removals()
	e.script(time.Minute, step{name: UpdateClaim, args: []any{claim}, check: func(_ json.RawMessage, err error) {
		require.Equal(t, KindStandbyUnavailable, kindOf(t, err).Kind)
	}}, step{name: UpdateDestroy, check: ok(t)}) // what the gateway then sends: answered, not held
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, 1, *removed)
	e.AssertNotCalled(t, "ImportWorkspace", mock.Anything, mock.Anything)
}

// release_standby removes an unclaimed standby, answering once it is
// gone; it is refused for a claimed one, which goes on serving.
func TestStandbyRelease(t *testing.T) {
	for _, c := range []struct {
		name         string
		build, after time.Duration // CreateContainer's time; when the release comes
	}{{"unclaimed", 0, time.Minute}, {"while building", time.Minute, time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.standbySteps(c.build)
			removed := e.removals()
			e.script(c.after, step{name: UpdateRelease, check: ok(t)})
			e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true})
			require.NoError(t, e.GetWorkflowError())
			require.Equal(t, 1, *removed)
		})
	}
	t.Run("claimed", func(t *testing.T) {
		e := newEnv(t)
		e.standbySteps(0)
		e.OnActivity(acts.ImportWorkspace, mock.Anything, importIn).Return(imported, nil).Once()
		e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
		e.script(time.Minute,
			step{name: UpdateClaim, args: []any{claim}, check: ok(t)},
			step{name: UpdateRelease, check: func(_ json.RawMessage, err error) {
				require.Equal(t, KindStandbyUnavailable, kindOf(t, err).Kind, "a claimed sandbox is never released")
			}, then: func() { require.Equal(t, PhaseReady, e.state().Phase) }},
			step{name: UpdateDestroy, check: ok(t)})
		e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: standbySpec, Standby: true})
		require.NoError(t, e.GetWorkflowError())
		e.AssertExpectations(t)
	})
}

// spareSpec is what a spare is started with: its id, no image.
var spareSpec = SandboxSpec{SandboxID: "sb1"}

// A spare makes the network and the volume only; a claim of any image
// makes the rest as a create of that image would, with the claim's
// workspace streamed in (no check of a container that never existed).
func TestSpareIsClaimedForAnyImage(t *testing.T) {
	e := newEnv(t)
	prepared := 0
	e.OnActivity(acts.PrepareSandbox, mock.Anything, spareSpec).Return(func(context.Context, SandboxSpec) error { prepared++; return nil })
	e.happyCreate()
	e.daemon(okDaemon)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
	e.RegisterDelayedCallback(func() {
		st := e.state()
		require.Equal(t, PhaseStandby, st.Phase)
		require.True(t, st.Standby)
		require.Empty(t, st.Container.Name, "a spare has no container")
		require.Equal(t, 1, prepared)
	}, 30*time.Second)
	other := claim
	other.Image = ""
	e.script(time.Minute, append([]step{
		step{name: UpdateClaim, args: []any{other}, check: func(_ json.RawMessage, err error) {
			require.Error(t, err)
			require.Equal(t, api.KindInvalidRequest, kindOf(t, err).Kind, "a claim names its image")
		}},
		step{name: UpdateClaim, args: []any{claim}, check: func(out json.RawMessage, err error) {
			require.Equal(t, "eos-sbx-sb1", readyAfterClaim(t, out, err).Container.Name)
		}},
	}, claimedOnceServes(t, "a spare")...)...)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spareSpec, Standby: true, StandbyTTL: time.Hour})
	require.True(t, e.IsWorkflowCompleted())
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, 1, prepared)
	e.AssertNotCalled(t, "ResolveDaemon", mock.Anything, mock.Anything)
}

// An unclaimed spare removes what it made when its TTL passes.
func TestSpareExpiresClean(t *testing.T) {
	e := newEnv(t)
	e.OnActivity(acts.PrepareSandbox, mock.Anything, spareSpec).Return(nil)
	removed := e.removals()
	e.expiresUnclaimed(spareSpec, removed)
	e.AssertNotCalled(t, "CheckImage", mock.Anything, mock.Anything)
}

// A claim of an image the host does not have is refused before the spare
// takes it (standby_unavailable, kept: the gateway keeps the spare and
// creates the usual way, which answers the missing image), and nothing of
// the spare changes: the next claim of an image that is there makes the
// sandbox, its image checked once.
func TestSpareRefusesAMissingImageAndWaitsOn(t *testing.T) {
	e := newEnv(t)
	prepared := 0
	e.OnActivity(acts.PrepareSandbox, mock.Anything, spareSpec).Return(func(context.Context, SandboxSpec) error { prepared++; return nil })
	e.OnActivity(acts.CheckImage, mock.Anything, "nosuch:1").Return(apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "image"}, "image nosuch:1 is not present on this Docker host")).Once()
	e.happyCreate()
	e.daemon(okDaemon)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil).Once()
	missing := claim
	missing.Image = "nosuch:1"
	e.script(time.Minute, append([]step{
		{name: UpdateClaim, args: []any{missing}, check: func(_ json.RawMessage, err error) {
			require.Error(t, err)
			ae := kindOf(t, err)
			require.Equal(t, KindStandbyUnavailable, ae.Kind, "a claim the spare cannot serve falls back to the usual create")
			require.Equal(t, true, ae.Details[DetailStandbyKept], "and the spare stays: %v", ae)
			require.Contains(t, ae.Message, "nosuch:1")
		}, then: func() {
			st := e.state()
			require.Equal(t, PhaseStandby, st.Phase, "the spare waits on")
			require.True(t, st.Standby)
			require.Empty(t, st.Container.Name)
		}},
		{name: UpdateClaim, args: []any{claim}, check: func(out json.RawMessage, err error) {
			require.Equal(t, "eos-sbx-sb1", readyAfterClaim(t, out, err).Container.Name)
		}},
	}, claimedOnceServes(t, "a spare")...)...)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spareSpec, Standby: true, StandbyTTL: time.Hour})
	require.True(t, e.IsWorkflowCompleted())
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, 1, prepared, "one network and volume, for both claims")
	e.AssertNumberOfCalls(t, "CheckImage", 2) // once per claim: the creation does not check again
	e.AssertNumberOfCalls(t, "CreateContainer", 1)
}

// A spare whose host does not answer the claim's image check is lost: the
// claim falls back (standby_unavailable, not kept) and the spare removes
// its network and volume.
func TestSpareLostAtTheImageCheck(t *testing.T) {
	e := newEnv(t)
	e.OnActivity(acts.PrepareSandbox, mock.Anything, spareSpec).Return(nil)
	e.OnActivity(acts.CheckImage, mock.Anything, "img").Return(errors.New("docker: connection refused"))
	removed := e.removals()
	e.script(time.Minute, step{name: UpdateClaim, args: []any{claim}, check: func(_ json.RawMessage, err error) {
		require.Error(t, err)
		ae := kindOf(t, err)
		require.Equal(t, KindStandbyUnavailable, ae.Kind)
		require.Nil(t, ae.Details[DetailStandbyKept], "a lost spare is not kept")
	}})
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spareSpec, Standby: true, StandbyTTL: time.Hour})
	require.True(t, e.IsWorkflowCompleted())
	require.Equal(t, 1, *removed, "the lost spare removed its network and volume")
	e.AssertNotCalled(t, "CreateContainer", mock.Anything, mock.Anything)
}

// claimedOnceServes: a second claim of a claimed standby (what) is
// refused, and the sandbox it became serves a session until destroyed.
func claimedOnceServes(t *testing.T, what string) []step {
	return []step{
		{name: UpdateClaim, args: []any{claim}, check: func(_ json.RawMessage, err error) {
			require.Error(t, err)
			require.Equal(t, KindStandbyUnavailable, kindOf(t, err).Kind, what+" is claimed once")
		}},
		{name: UpdateCreateSession, args: []any{CreateSessionRequest{Agent: "a"}}, check: ok(t)},
		{name: UpdateDestroy, check: ok(t)},
	}
}

// readyAfterClaim is the answer of a claim that took: the sandbox ready,
// no standby any more, on the base its import made.
func readyAfterClaim(t *testing.T, out json.RawMessage, err error) SandboxState {
	require.NoError(t, err)
	var st SandboxState
	require.NoError(t, json.Unmarshal(out, &st))
	require.Equal(t, PhaseReady, st.Phase)
	require.False(t, st.Standby)
	require.Equal(t, "B-1", st.BaseID)
	return st
}
