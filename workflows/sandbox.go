package workflows

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// continueAsNewAfter bounds the history of one run even where the server
// does not suggest continuing as new yet (runs recorded before
// versionContinueSooner).
const continueAsNewAfter = 4000

// versionContinueSooner marks runs that continue as new at the first
// moment with no update running after continueAsNewSooner events (about
// 100 updates), and after continueAsNewAfter events in any case, draining
// first (drain).
// Every update costs the server more the longer its run (each write
// carries the run's whole update registry): measured on 2 cores, a
// session create and destroy cost 11.2 ms of CPU each at a 4000-event
// bound and 10.3 ms at 600, and a plain update 6.4 ms in a run's first
// 100 updates against 8.9 ms after 800.
const versionContinueSooner = "continue-as-new-sooner"

// continueAsNewSooner is the soft history bound of runs from
// versionContinueSooner on: past it a run with at most quietMaxSessions
// sessions hands over at a moment with no update running. A hand-over
// makes every agent that sends an update meanwhile send it again (each a
// refused workflow task for the server), so a busy sandbox (50 agents,
// where the daemon, not Temporal, is the bottleneck: in 10 s the gateway
// process used 2.9 s of CPU, the daemon 6.6 s) goes on to
// continueAsNewAfter as before.
const continueAsNewSooner = 600

// quietMaxSessions: see continueAsNewSooner.
const quietMaxSessions = 8

// KindContinuing refuses an update while the sandbox's run drains to
// continue as new: lifecycle.Update sends it again, and the next run
// takes it (a few milliseconds later).
const KindContinuing = "sandbox_continuing"

// versionPublishSideBySide marks runs in which publishes of different
// sessions do not wait for each other (they did under commitMu before).
const versionPublishSideBySide = "publish-side-by-side"

// versionLostKeepsVolume marks runs in which a sandbox whose container
// vanished keeps its state volume (it was removed before).
const versionLostKeepsVolume = "lost-keeps-volume"

// versionStreamedImport marks runs whose create streams the workspace to
// the started daemon, which imports it in one pass (ImportWorkspace), in
// place of a copy into the container before it starts and init_base; the
// image check, volume and container are one step (CreateContainer checks
// the image and creates the volume itself).
const versionStreamedImport = "create-streamed-import"

// SandboxWorkflow is the entity of one sandbox: it creates the sandbox's
// Docker objects (compensating on failure), serves the lifecycle updates,
// reaps idle sessions, and destroys everything when asked.
func SandboxWorkflow(ctx workflow.Context, in SandboxInput) (SandboxResult, error) {
	s, err := newSandbox(ctx, in)
	if err != nil {
		return SandboxResult{}, err
	}
	defer s.forgetMirrored(ctx) // the run ends: its copy goes (the next run leaves its own)
	if in.State == nil {
		if err := s.create(ctx); errors.Is(err, errStandbyEnded) {
			// An unclaimed standby removed what it made: nothing failed.
			s.settle(ctx)
			s.state.Phase = PhaseStopped
			return SandboxResult{SandboxID: s.id(), Phase: PhaseStopped}, nil
		} else if err != nil {
			s.state.Phase, s.state.Error = PhaseFailed, err.Error()
			if e, ok := apperr.From(err); ok {
				s.state.Failure = e
			}
			s.settle(ctx)
			return SandboxResult{SandboxID: s.id(), Phase: PhaseFailed, Error: err.Error()}, err
		}
	}
	return s.run(ctx)
}

type sandbox struct {
	mirrorStale bool // an update handler started since the state was last mirrored (mirror.go)
	in          SandboxInput
	state       *SandboxState
	commitMu    workflow.Mutex
	// publishing holds the sessions whose publish runs now (publishes of
	// different sessions run side by side; one session's do not).
	publishing map[string]bool
	lost       bool
	// claim is a standby's accepted claim; claimed, that the creation
	// took it (standby.go).
	claim   *ClaimRequest
	claimed bool
	// refused holds the claims a spare turned down (their image is not on
	// the host) with the answer to each; the spare waits on.
	refused map[*ClaimRequest]error
	// released: release_standby asked an unclaimed standby to go.
	released bool
	// busy counts running daemon-using updates (a pause waits for them);
	// wakeRev changes when the run loop must recompute its timer
	// (lifecycle_ttl.go).
	busy, wakeRev   int
	expirePostponed bool
	// lastPublish is the latest publish's record (query last_publish);
	// memoPending says the memo does not show it yet, memoTimer that a
	// timer will upsert it, memoAt when it was last upserted (publish.go).
	lastPublish            *PublishRecord
	memoPending, memoTimer bool
	memoAt                 time.Time
	// historyBound is when the run continues as new (run), quietBound
	// when it does so at a moment with no update running (0: never);
	// draining, that it is about to, and refuses new updates (drain).
	historyBound, quietBound int
	draining                 bool
	// inFlight counts the update handlers running now (counted numbers
	// them by handlerSeq); waitingFor, those of them started up to waitUpTo
	// that drain waits for.
	inFlight, handlerSeq, waitingFor, waitUpTo int
	log                                        interface {
		Info(string, ...interface{})
		Error(string, ...interface{})
	}
}

func newSandbox(ctx workflow.Context, in SandboxInput) (*sandbox, error) {
	s := &sandbox{in: in, state: in.State, commitMu: workflow.NewMutex(ctx), publishing: map[string]bool{}, log: workflow.GetLogger(ctx)}
	if s.state == nil {
		s.state = &SandboxState{SandboxID: in.Spec.SandboxID, Phase: PhaseCreating, Sessions: map[string]*SessionRecord{},
			Created: workflow.Now(ctx).UTC(), Standby: in.Standby}
	}
	s.state.Runs++
	// The record names the sandbox's host (its queue) for the gateway's
	// routing; setting it schedules nothing, so old histories replay.
	s.state.HostQueue = in.HostQueue
	if err := workflow.SetQueryHandler(ctx, QueryState, func() (*SandboxState, error) { return s.state, nil }); err != nil {
		return nil, err
	}
	if err := workflow.SetQueryHandler(ctx, QueryLastPublish, func() (*PublishRecord, error) { return s.lastPublish, nil }); err != nil {
		return nil, err
	}
	handlers := []struct {
		name     string
		fn       any
		validate any
	}{
		{UpdateWaitReady, s.waitReady, nil},
		{UpdateCreateSession, s.createSession, s.validateReady},
		{UpdateDestroySession, s.destroySession, s.validateSession},
		{UpdatePublish, s.publish, s.validatePublish},
		{UpdateRefresh, s.refresh, s.validateSession},
		{UpdateAmend, s.amend, s.validateAmend},
		{UpdateSquash, s.squash, s.validateReadyNoArg},
		{UpdateExport, s.export, s.validateExport},
		{UpdateDestroy, s.destroy, nil},
		{UpdateResolveDaemon, s.resolveDaemon, s.validateReadyNoArg},
		{UpdateClaim, s.claimStandby, s.validateClaim},
		{UpdateRelease, s.releaseStandby, s.validateUnclaimed},
	}
	for _, h := range handlers {
		if err := s.handle(ctx, h.name, h.fn, h.validate); err != nil {
			return nil, err
		}
	}
	if err := s.registerLifecycle(ctx); err != nil {
		return nil, err
	}
	workflow.Go(ctx, s.mirrorLoop)
	workflow.Go(ctx, func(ctx workflow.Context) {
		ch := workflow.GetSignalChannel(ctx, SignalContainerLost)
		for {
			var reason string
			ch.Receive(ctx, &reason)
			s.lost = true
			s.state.Error = "container lost: " + reason
		}
	})
	return s, nil
}

func (s *sandbox) id() string { return s.state.SandboxID }

func (s *sandbox) queue() string {
	if s.in.HostQueue != "" {
		return s.in.HostQueue
	}
	return TaskQueue
}

// create runs the creation saga: each step that made something pushes its
// compensation; a failure runs them in reverse on a disconnected context.
func (s *sandbox) create(ctx workflow.Context) (err error) {
	if err := checkLifecycleInput(s.in); err != nil {
		return err
	}
	spec := s.in.Spec
	dctx := dockerOptions(ctx, s.queue())
	var undo []func(workflow.Context) error
	defer func() {
		if err == nil {
			return
		}
		cctx, _ := workflow.NewDisconnectedContext(ctx)
		cctx = cleanupOptions(cctx, s.queue())
		for i := len(undo) - 1; i >= 0; i-- {
			if cerr := undo[i](cctx); cerr != nil {
				s.log.Error("compensation failed", "sandbox_id", spec.SandboxID, "error", cerr)
			}
		}
	}()
	remove := func(c workflow.Context) error {
		return workflow.ExecuteActivity(c, ActRemoveSandbox, spec.SandboxID).Get(c, nil)
	}
	// waitForClaim holds a standby until a claim makes it the claimant's
	// (spec is the claim's from then on) or it ends unclaimed
	// (errStandbyEnded): then it is removed here, not by the deferred
	// compensation, since a destroy that waits for "stopped" must see it
	// before the run ends.
	imageChecked := false
	waitForClaim := func() error {
		claimed, checked, destroyed, err := s.awaitClaim(ctx)
		if err != nil {
			return err
		}
		if claimed {
			spec, imageChecked = s.in.Spec, checked
			return nil
		}
		undo = nil
		if !destroyed { // else destroy_sandbox removes it
			cctx, _ := workflow.NewDisconnectedContext(ctx)
			if err := remove(cleanupOptions(cctx, s.queue())); err != nil {
				s.log.Error("remove the unclaimed standby", "sandbox_id", spec.SandboxID, "error", err)
			}
			s.state.Phase = PhaseStopped
		}
		return errStandbyEnded
	}
	spare := s.spare() // decided at the start: a claim gives it an image
	if spare {
		// A spare (standby.go): the network and the state volume, no
		// image yet; the claim names it, and the creation goes on from
		// the image check as any other's.
		undo = append(undo, remove)
		if err := workflow.ExecuteActivity(dctx, ActPrepareSandbox, spec).Get(ctx, nil); err != nil {
			return s.stepFailed("prepare network and volume", err)
		}
		if err := waitForClaim(); err != nil {
			return err
		}
	}
	if !imageChecked {
		if err := workflow.ExecuteActivity(dctx, ActCheckImage, spec.Image).Get(ctx, nil); err != nil {
			return s.stepFailed("check image", err)
		}
	}
	if !s.in.Adopt && !spare {
		undo = append(undo, remove) // removes the container and the volume, whichever exist
	}
	if s.in.Adopt {
		// An orphan keeps its volume whatever happens here, and its old
		// container stops so the copy-in (daemon binary, this deployment's
		// token) is redone.
		undo = nil
		if err := workflow.ExecuteActivity(dctx, ActStopContainer, spec.SandboxID).Get(ctx, nil); err != nil {
			return s.stepFailed("stop the orphan's container", err)
		}
	}
	// A new sandbox (not an adopted orphan, not a follower of a shared
	// base) gets its workspace streamed to its daemon once it runs.
	streamed := !s.in.Adopt && s.in.BaseID == "" &&
		workflow.GetVersion(ctx, versionStreamedImport, workflow.DefaultVersion, 1) == 1
	if !streamed {
		if err := workflow.ExecuteActivity(dctx, ActCreateVolume, spec).Get(ctx, nil); err != nil {
			return s.stepFailed("create volume", err)
		}
	}
	var info ContainerInfo
	cspec := spec
	cspec.PrefetchWorkspace = streamed && (!s.in.Standby || spare)
	if err := workflow.ExecuteActivity(dctx, ActCreateContainer, cspec).Get(ctx, &info); err != nil {
		return s.stepFailed("create container", err)
	}
	if !s.in.Adopt && !streamed {
		var copied CopyReport
		if err := workflow.ExecuteActivity(dctx, ActCopyWorkspace, spec).Get(ctx, &copied); err != nil {
			return s.stepFailed("copy workspace", err)
		}
		s.state.GitHead = copied.GitHead
	}
	if err := workflow.ExecuteActivity(dctx, ActStartContainer, spec.SandboxID).Get(ctx, &info); err != nil {
		return s.stepFailed("start container", err)
	}
	if err := workflow.ExecuteActivity(dctx, ActWaitReady, spec.SandboxID, info.Daemon).Get(ctx, nil); err != nil {
		return s.stepFailed("wait for the daemon", err)
	}
	s.state.Container = info
	if s.in.Standby && !spare {
		if err := waitForClaim(); err != nil {
			return err
		}
	}
	var base api.InitBaseResult
	if streamed {
		in := ImportWorkspaceInput{Spec: spec, RequestID: workflow.GetInfo(ctx).WorkflowExecution.ID + "/import_base"}
		var imp ImportWorkspaceResult
		if err := workflow.ExecuteActivity(dctx, ActImportWorkspace, in).Get(ctx, &imp); err != nil {
			return s.stepFailed("import workspace", err)
		}
		s.state.GitHead, base = imp.Copy.GitHead, imp.Base
		if base.BaseID == "" {
			return s.stepFailed("import workspace", apperr.Newf(api.KindInternal, nil, "the daemon imported a base without an id"))
		}
	} else {
		args, _ := json.Marshal(map[string]any{"source_dir": "/eos/import/src", "all": spec.ImportAll, "remove_source": true})
		if s.in.BaseID != "" {
			args, _ = json.Marshal(map[string]any{"base_id": s.in.BaseID})
		}
		out, err := s.call(ctx, "init_base", args, "init_base")
		if err != nil {
			return s.stepFailed("import base", err)
		}
		if err := decode("init_base", out, &base); err != nil {
			return s.stepFailed("import base", err)
		}
	}
	s.state.BaseID = base.BaseID
	if spec.SharedBase != nil {
		s.state.SharedRootHash = base.RootHash
	}
	if s.in.Adopt {
		if err := s.adoptSessions(ctx); err != nil {
			return s.stepFailed("list the orphan's sessions", err)
		}
	}
	s.state.Phase = PhaseReady
	return nil
}

// adoptSessions records the sessions the adopted daemon brought back from
// its volume, so they serve (and publish) as before.
func (s *sandbox) adoptSessions(ctx workflow.Context) error {
	out, err := s.call(ctx, "list_workspace_sessions", nil, "adopt/sessions")
	if err != nil {
		return err
	}
	var list struct {
		Sessions []api.SessionInfo `json:"workspace_sessions"`
	}
	if err := decode("list_workspace_sessions", out, &list); err != nil {
		return err
	}
	for _, si := range list.Sessions {
		if si.Implicit {
			continue
		}
		s.state.Sessions[si.WorkspaceSessionID] = &SessionRecord{ID: si.WorkspaceSessionID, NetworkProfile: si.NetworkProfile,
			Agent: si.Agent, Created: workflow.Now(ctx).UTC()}
	}
	return nil
}

// stepFailed logs which creation step failed and returns the activity's
// application error itself, so its type (ImageNotFound, DaemonError...)
// reaches the caller unwrapped.
func (s *sandbox) stepFailed(step string, err error) error {
	s.log.Error("sandbox creation step failed", "sandbox_id", s.id(), "step", step, "error", err)
	return unwrapChild(err)
}

// call runs one daemon RPC with a request id derived from the workflow.
func (s *sandbox) call(ctx workflow.Context, op string, args json.RawMessage, key string) (json.RawMessage, error) {
	var out json.RawMessage
	call := DaemonCall{SandboxID: s.id(), Daemon: s.state.Container.Daemon, Direct: s.state.Container.DaemonDirect, Op: op, Args: args,
		RequestID: workflow.GetInfo(ctx).WorkflowExecution.ID + "/" + key}
	err := s.callDaemon(ctx, daemonOptions(ctx, s.queue()), call, &out)
	return out, err
}

// run serves updates until the sandbox is destroyed or its container is
// lost, reaping idle sessions and continuing as new when history is long.
func (s *sandbox) run(ctx workflow.Context) (SandboxResult, error) {
	s.historyBound = continueAsNewAfter
	sooner := workflow.GetVersion(ctx, versionContinueSooner, workflow.DefaultVersion, 1) != workflow.DefaultVersion
	if sooner {
		s.quietBound = continueAsNewSooner
	}
	for {
		wait := 24 * time.Hour
		if s.in.SessionTTL > 0 {
			wait = s.in.SessionTTL / 2
		}
		wait, rev := s.nextWake(ctx, wait), s.wakeRev
		done, err := workflow.AwaitWithTimeout(ctx, wait, func() bool {
			return s.state.Phase == PhaseStopped || s.lost || s.suggestContinue(ctx) || s.wakeRev != rev
		})
		if err != nil {
			return SandboxResult{}, err
		}
		switch {
		case s.state.Phase == PhaseStopped:
			_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
			s.flushLastPublish(ctx)
			return SandboxResult{SandboxID: s.id(), Phase: PhaseStopped}, nil
		case s.lost:
			s.state.Phase = PhaseFailed
			s.settle(ctx)
			s.flushLastPublish(ctx)
			// Nothing is deleted by inference: the state volume (the work)
			// stays, an orphan to adopt or delete. Runs recorded before
			// replay as they ran.
			if workflow.GetVersion(ctx, versionLostKeepsVolume, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
				cctx := cleanupOptions(ctx, s.queue())
				_ = workflow.ExecuteActivity(cctx, ActRemoveSandbox, s.id()).Get(ctx, nil)
			}
			return SandboxResult{SandboxID: s.id(), Phase: PhaseFailed, Error: s.state.Error}, nil
		case s.suggestContinue(ctx):
			if sooner {
				s.drain(ctx)
				if s.lost || s.state.Phase == PhaseStopped {
					// Destroyed, or its container lost, while it drained:
					// that ends the run, not a hand-over (a new run would
					// not know the container is gone).
					s.draining = false
					continue
				}
			} else {
				_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
			}
			s.flushLastPublish(ctx) // the next run starts with this run's memo
			in := s.in
			in.State = s.state
			return SandboxResult{}, workflow.NewContinueAsNewError(ctx, SandboxWorkflowName, in)
		case !done && s.in.SessionTTL > 0:
			s.expire(ctx)
			s.reap(ctx)
		case !done:
			s.expire(ctx)
		}
	}
}

func (s *sandbox) suggestContinue(ctx workflow.Context) bool {
	info := workflow.GetInfo(ctx)
	n := info.GetCurrentHistoryLength()
	return info.GetContinueAsNewSuggested() || n > s.historyBound ||
		s.quietBound > 0 && n > s.quietBound && len(s.state.Sessions) <= quietMaxSessions && workflow.AllHandlersFinished(ctx)
}

// drain readies the run to continue as new and ends with no update running
// and new ones refused (KindContinuing; lifecycle.Send sends them again and
// the next run takes them). First it waits, still taking updates, for a
// moment with none running: usually milliseconds. Under a steady stream of
// updates there may be none, so after drainPatience it refuses new ones
// while the running ones finish; if one still runs drainPatience later (a
// long update: an export, a verified publish's tests), it takes updates
// again until the ones running then have finished, and starts over. Last,
// the workflow task that carries the final answers ends (a Pass activity
// on the workflow's own queue, about 5 ms), so that those answers are
// recorded before the continue-as-new command: an answer sent in the same
// task as that command can be lost and its update run again on the next
// run (temporalio/temporal#6375).
func (s *sandbox) drain(ctx workflow.Context) {
	idle := func() bool { return workflow.AllHandlersFinished(ctx) }
	for {
		quiet := awaitFor(ctx, drainPatience, idle)
		s.draining = true
		if !quiet {
			quiet = awaitFor(ctx, drainPatience, idle)
		}
		if quiet {
			break
		}
		s.draining = false
		s.waitingFor, s.waitUpTo = s.inFlight, s.handlerSeq
		_ = workflow.Await(ctx, func() bool { return s.waitingFor == 0 })
	}
	// It does nothing, so a worker that took it and died is noticed
	// within 2 s and it runs again on another (updates are refused until
	// the hand-over ends).
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{TaskQueue: TaskQueue, StartToCloseTimeout: 2 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumInterval: time.Second}})
	if err := workflow.ExecuteActivity(actx, ActPass).Get(ctx, nil); err != nil {
		s.log.Error("hand-over activity failed; continuing as new", "sandbox_id", s.id(), "error", err)
	}
}

// drainPatience is how long each of drain's waits lasts.
const drainPatience = time.Second

// awaitFor waits up to d for cond: without a timer when cond holds
// already, and with its timer cancelled when cond comes first
// (workflow.AwaitWithTimeout leaves it to fire later, a workflow task for
// nothing).
func awaitFor(ctx workflow.Context, d time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	tctx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	ok, _ := workflow.AwaitWithTimeout(tctx, d, cond)
	return ok
}

// handle registers update name: fn counted (counted), its validator
// validate (nil: none) behind the drain's refusal (guarded).
func (s *sandbox) handle(ctx workflow.Context, name string, fn, validate any) error {
	return workflow.SetUpdateHandlerWithOptions(ctx, name, s.counted(name, fn), workflow.UpdateHandlerOptions{Validator: s.guarded(name, fn, validate)})
}

// counted wraps update handler fn of name so s.inFlight counts the
// invocations running now (drain waits for them; counted numbers them by
// handlerSeq) and s.busy those of trackedUpdates (a pause waits for
// them). The wrapper has the handler's own type (the SDK reads it by
// reflection) and adds no command.
func (s *sandbox) counted(name string, fn any) any {
	v := reflect.ValueOf(fn)
	busy := trackedUpdates[name]
	return reflect.MakeFunc(v.Type(), func(args []reflect.Value) []reflect.Value {
		s.mirrorStale = true // the state handlers start from is copied (mirrorLoop)
		s.handlerSeq++
		s.inFlight++
		if busy {
			s.busy++
		}
		id := s.handlerSeq
		defer func() {
			s.inFlight--
			if busy {
				s.busy--
			}
			if id <= s.waitUpTo && s.waitingFor > 0 {
				s.waitingFor--
			}
		}()
		return v.Call(args)
	}).Interface()
}

var errorType = reflect.TypeOf((*error)(nil)).Elem()

// guarded is the validator of the update handler fn of update name:
// validate (nil: none) behind the drain's refusal and a cap on the size of
// its arguments (checkArgsSize). Validators decide nothing that is
// recorded (a refused update leaves no trace in the history), so adding
// one replays as before.
func (s *sandbox) guarded(name string, fn, validate any) any {
	ft := reflect.TypeOf(fn)
	in := make([]reflect.Type, 0, ft.NumIn())
	for i := 1; i < ft.NumIn(); i++ { // the handler's arguments after its workflow.Context
		in = append(in, ft.In(i))
	}
	var v reflect.Value
	if validate != nil {
		v = reflect.ValueOf(validate)
	}
	return reflect.MakeFunc(reflect.FuncOf(in, []reflect.Type{errorType}, false), func(args []reflect.Value) []reflect.Value {
		if s.draining {
			err := reflect.New(errorType).Elem()
			err.Set(reflect.ValueOf(apperr.Newf(KindContinuing, map[string]any{"sandbox_id": s.id()},
				"sandbox %s is starting its next workflow run; send the update again", s.id())))
			return []reflect.Value{err}
		}
		if aerr := checkArgsSize(name, args); aerr != nil {
			err := reflect.New(errorType).Elem()
			err.Set(reflect.ValueOf(aerr))
			return []reflect.Value{err}
		}
		if v.IsValid() {
			return v.Call(args)
		}
		return []reflect.Value{reflect.Zero(errorType)}
	}).Interface()
}

// checkArgsSize refuses an update whose arguments, as JSON, are over
// api.MaxUpdateArgsBytes: accepted, they would be recorded in an event
// over the history's 2 MiB limit, which fails the workflow task and holds
// up every other update until this one times out. The gateway refuses
// them before sending; this covers any other client.
func checkArgsSize(name string, args []reflect.Value) error {
	n := 0
	for _, a := range args {
		b, err := json.Marshal(a.Interface())
		if err != nil {
			return apperr.Newf(api.KindInvalidRequest, map[string]any{"update": name}, "arguments of %s: %v", name, err)
		}
		n += len(b)
	}
	if aerr := api.CheckUpdateArgsSize(name, n); aerr != nil {
		return apperr.Newf(aerr.Kind, aerr.Details, "%s", aerr.Message)
	}
	return nil
}

// settle waits for running handlers, so none outlives the run.
func (s *sandbox) settle(ctx workflow.Context) {
	_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
}

// reap archives sessions idle for longer than the TTL: the daemon keeps
// their unpublished changes on the state volume and lists them.
func (s *sandbox) reap(ctx workflow.Context) {
	if s.state.Phase != PhaseReady {
		return
	}
	args, _ := json.Marshal(map[string]any{"idle_for_ms": s.in.SessionTTL.Milliseconds()})
	out, err := s.call(ctx, "archive_idle_sessions", args, fmt.Sprintf("reap/%d", workflow.GetInfo(ctx).GetCurrentHistoryLength()))
	if err != nil {
		s.log.Error("reap idle sessions", "sandbox_id", s.id(), "error", err)
		return
	}
	var res api.ArchiveResult
	if err := decode("archive_idle_sessions", out, &res); err != nil {
		s.log.Error("reap idle sessions", "sandbox_id", s.id(), "error", err)
		return
	}
	{
		for _, a := range res.Archived {
			if _, known := s.state.Sessions[a.ID]; !known {
				continue // already recorded (a retried reap)
			}
			delete(s.state.Sessions, a.ID)
			s.state.Archived = append(s.state.Archived, a)
		}
	}
}

// errNotReady rejects updates before the sandbox is ready or after it stopped.
func (s *sandbox) validateReadyNoArg() error { return s.validateReady(CreateSessionRequest{}) }

func (s *sandbox) validateReady(CreateSessionRequest) error {
	if s.state.Phase != PhaseReady {
		if err := s.errPaused(); err != nil {
			return err
		}
		return apperr.Newf(api.KindInvalidRequest, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase}, "sandbox %s is %s", s.id(), s.state.Phase)
	}
	return nil
}

func (s *sandbox) validateSession(r SessionRequest) error {
	if err := s.validateReady(CreateSessionRequest{}); err != nil {
		return err
	}
	if _, ok := s.state.Sessions[r.WorkspaceSessionID]; !ok {
		return apperr.Newf(api.KindNotFound, map[string]any{"workspace_session_id": r.WorkspaceSessionID}, "workspace session not found: %s", r.WorkspaceSessionID)
	}
	if s.publishing[r.WorkspaceSessionID] && !r.Force {
		return s.errPublishing("publish, refresh or destroy", r.WorkspaceSessionID)
	}
	return nil
}

func (s *sandbox) validatePublish(r PublishRequest) error {
	if err := validateVerify(r); err != nil {
		return err
	}
	return s.validateSession(SessionRequest{WorkspaceSessionID: r.WorkspaceSessionID})
}

// errPublishing refuses a second publish, a refresh or a destroy of a
// session while its publish runs (it froze the session's changes and holds
// its lease until it commits).
func (s *sandbox) errPublishing(op, sessionID string) error {
	return apperr.Newf(api.KindOperationConflict, map[string]any{"workspace_session_id": sessionID},
		"%s: workspace session %s is being published; wait for that publish to end", op, sessionID)
}

func (s *sandbox) validateAmend(r AmendRequest) error {
	if err := s.validateReady(CreateSessionRequest{}); err != nil {
		return err
	}
	switch r.Op {
	case "file_write", "file_edit", "file_delete", "file_move", "file_upload":
		return nil
	}
	return apperr.Newf(api.KindInvalidRequest, map[string]any{"op": r.Op}, "amend supports file_write, file_edit, file_delete, file_move, file_upload, not %s", r.Op)
}

func (s *sandbox) validateExport(r ExportRequest) error {
	if err := s.validateReady(CreateSessionRequest{}); err != nil {
		return err
	}
	if r.Dest == "" || r.Dest[0] != '/' {
		return apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "dest"}, "dest must be an absolute host path")
	}
	if (r.Format == "git") != (r.Branch != "") {
		return apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "branch"}, "branch is required with format git, and only taken by it")
	}
	return nil
}

func (s *sandbox) waitReady(ctx workflow.Context) (*SandboxState, error) {
	if err := workflow.Await(ctx, func() bool { return s.state.Phase != PhaseCreating }); err != nil {
		return nil, err
	}
	if s.state.Phase == PhaseFailed {
		f := api.Errorf(api.KindOperationFailed, nil, "%s", s.state.Error)
		if s.state.Failure != nil {
			f = &api.Error{Kind: s.state.Failure.Kind, Message: s.state.Failure.Message, Details: s.state.Failure.Details}
		}
		f.Message = "sandbox creation failed: " + f.Message
		return s.state, apperr.New(f)
	}
	return s.state, nil
}

func (s *sandbox) updateKey(ctx workflow.Context) string {
	return "update/" + workflow.GetCurrentUpdateInfo(ctx).ID
}

func (s *sandbox) createSession(ctx workflow.Context, r CreateSessionRequest) (json.RawMessage, error) {
	args, _ := json.Marshal(r)
	out, err := s.call(ctx, "create_workspace_session", args, s.updateKey(ctx))
	if err != nil {
		return nil, err
	}
	var info api.SessionInfo
	if err := decode("create_workspace_session", out, &info); err != nil {
		return nil, err
	}
	if info.WorkspaceSessionID == "" {
		return nil, apperr.Newf(api.KindInternal, nil, "the daemon created a session without an id")
	}
	s.state.Sessions[info.WorkspaceSessionID] = &SessionRecord{ID: info.WorkspaceSessionID, NetworkProfile: info.NetworkProfile, Agent: r.Agent, Created: workflow.Now(ctx).UTC()}
	return out, nil
}

// versionDestroyGoneIsDone marks runs in which destroying a recorded
// session the daemon no longer has answers destroyed (runs recorded
// before answered not_found).
const versionDestroyGoneIsDone = "destroy-gone-is-done"

func (s *sandbox) destroySession(ctx workflow.Context, r SessionRequest) (json.RawMessage, error) {
	args, _ := json.Marshal(r)
	out, err := s.call(ctx, "destroy_workspace_session", args, s.updateKey(ctx))
	if err != nil {
		if ae, ok := apperr.From(err); ok && ae.Kind == api.KindNotFound {
			// The daemon has no such session: a first call of this
			// destroy did it (a local call that took longer than its
			// bound, an activity whose answer was lost), or one published
			// while its update was lost with a killed Temporal. Forget it
			// too; a session this sandbox recorded is gone, which is what
			// its destroy asked.
			_, known := s.state.Sessions[r.WorkspaceSessionID]
			delete(s.state.Sessions, r.WorkspaceSessionID)
			if known && workflow.GetVersion(ctx, versionDestroyGoneIsDone, workflow.DefaultVersion, 1) != workflow.DefaultVersion {
				return json.Marshal(api.SessionDestroyed{WorkspaceSessionID: r.WorkspaceSessionID, Destroyed: true})
			}
		}
		return nil, err
	}
	delete(s.state.Sessions, r.WorkspaceSessionID)
	return out, nil
}

// publish runs one exactly-once daemon call (publishTx; runs recorded
// before ran a PublishWorkflow child). Publishes of different sessions run
// side by side: the daemon's layer store serializes the commits themselves
// (its writer lock, a re-check against the head it commits on), so only
// the few milliseconds of a commit are one at a time, not each publish's
// whole prepare, commit and finalize (measured: 5 agents publishing at once
// waited 5x the latency of one).
func (s *sandbox) publish(ctx workflow.Context, r PublishRequest) (json.RawMessage, error) {
	if workflow.GetVersion(ctx, versionPublishSideBySide, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		// Runs recorded before publishes ran side by side replay as they ran.
		if err := s.commitMu.Lock(ctx); err != nil {
			return nil, err
		}
		defer s.commitMu.Unlock()
	} else {
		if s.publishing[r.WorkspaceSessionID] { // accepted together with another
			return nil, s.errPublishing("publish", r.WorkspaceSessionID)
		}
		s.publishing[r.WorkspaceSessionID] = true
		defer delete(s.publishing, r.WorkspaceSessionID)
	}
	s.state.PublishSeq++
	id := PublishWorkflowID(s.id(), r.WorkspaceSessionID, s.state.PublishSeq)
	if workflow.GetVersion(ctx, versionPublishOneActivity, workflow.DefaultVersion, 1) != workflow.DefaultVersion {
		if r.Verify != nil {
			return s.publishVerified(ctx, r, id)
		}
		return s.publishTx(ctx, r, id)
	}
	// Runs recorded before publishes were one activity replay the child.
	if r.Verify != nil {
		// Never reached in replay: no recorded run had verified publishes.
		return nil, apperr.Newf(api.KindOperationFailed, map[string]any{"sandbox_id": s.id(), "arg": "verify"},
			"verified publish needs a newer run of sandbox %s's workflow; it starts with its next continue-as-new (publish without verify meanwhile)", s.id())
	}
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{WorkflowID: id, TaskQueue: TaskQueue})
	in := PublishInput{SandboxID: s.id(), HostQueue: s.in.HostQueue, Daemon: s.state.Container.Daemon,
		SessionID: r.WorkspaceSessionID, TxID: id, Keep: r.Keep, Message: r.Message, RequestID: workflow.GetCurrentUpdateInfo(ctx).ID}
	var out json.RawMessage
	err := workflow.ExecuteChildWorkflow(cctx, PublishWorkflowName, in).Get(ctx, &out)
	if err != nil {
		return nil, unwrapChild(err)
	}
	s.state.Publishes++
	if !r.Keep {
		delete(s.state.Sessions, r.WorkspaceSessionID)
	}
	return out, nil
}

// decode reads a daemon answer into its wire type; an answer that does not
// decode is an error, never a zero value.
func decode(op string, raw json.RawMessage, out any) error {
	if err := json.Unmarshal(raw, out); err != nil {
		return apperr.Newf(api.KindInternal, map[string]any{"op": op}, "the daemon's answer to %s does not decode: %v", op, err)
	}
	return nil
}

// unwrapChild returns the application error inside a child's failure, so
// callers see the daemon's conflict report, not a wrapper.
func unwrapChild(err error) error {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return app
	}
	return err
}

func (s *sandbox) refresh(ctx workflow.Context, r SessionRequest) (json.RawMessage, error) {
	if err := s.commitMu.Lock(ctx); err != nil {
		return nil, err
	}
	defer s.commitMu.Unlock()
	args, _ := json.Marshal(map[string]any{"workspace_session_id": r.WorkspaceSessionID})
	return s.call(ctx, "refresh_workspace_session", args, s.updateKey(ctx))
}

func (s *sandbox) amend(ctx workflow.Context, r AmendRequest) (json.RawMessage, error) {
	if err := s.commitMu.Lock(ctx); err != nil {
		return nil, err
	}
	defer s.commitMu.Unlock()
	return s.call(ctx, r.Op, r.Args, s.updateKey(ctx))
}

func (s *sandbox) squash(ctx workflow.Context) (json.RawMessage, error) {
	if err := s.commitMu.Lock(ctx); err != nil {
		return nil, err
	}
	defer s.commitMu.Unlock()
	return s.call(ctx, "squash_layerstack", nil, s.updateKey(ctx))
}

func (s *sandbox) export(ctx workflow.Context, r ExportRequest) (*api.ExportResult, error) {
	var out *api.ExportResult
	spec := ExportSpec{SandboxID: s.id(), Daemon: s.state.Container.Daemon, Dest: r.Dest, Format: r.Format, Branch: r.Branch, Force: r.Force}
	if r.Format == "git" {
		spec.WorkspaceRoot, spec.GitParent = s.in.Spec.WorkspaceRoot, s.state.GitHead
	}
	err := workflow.ExecuteActivity(dockerOptions(ctx, s.queue()), ActExportChanges, spec).Get(ctx, &out)
	return out, err
}

// resolveDaemon asks the host's worker where Docker publishes the daemon
// now and records it: after a container or Engine restart the daemon is
// back within a second, possibly on another host port.
func (s *sandbox) resolveDaemon(ctx workflow.Context) (*ContainerInfo, error) {
	var info ContainerInfo
	if err := workflow.ExecuteActivity(resolveOptions(ctx, s.queue()), ActResolveDaemon, s.id()).Get(ctx, &info); err != nil {
		if temporal.IsTimeoutError(err) {
			return nil, apperr.Newf(api.KindOperationFailed, map[string]any{"sandbox_id": s.id(), "availability": "unavailable"},
				"the worker of sandbox %s's host did not answer within %s; its work is kept, and it is served again when that worker is back", s.id(), resolveWithin)
		}
		return nil, err
	}
	if info.State != "running" || info.Daemon.Port == 0 {
		return nil, apperr.Newf(api.KindOperationFailed, map[string]any{"sandbox_id": s.id(), "container_state": info.State, "availability": "unavailable"},
			"the container of sandbox %s is %s; it serves again once Docker has restarted it", s.id(), info.State)
	}
	s.state.Container.ContainerID, s.state.Container.Daemon, s.state.Container.State = info.ContainerID, info.Daemon, info.State
	s.state.Container.DaemonDirect = info.DaemonDirect
	return &s.state.Container, nil
}

// destroy stops and removes the sandbox's container and volume. It is
// idempotent: a second destroy of a stopped sandbox returns at once.
func (s *sandbox) destroy(ctx workflow.Context) (*SandboxState, error) {
	if s.state.Phase == PhaseStopped || s.state.Phase == PhaseStopping {
		_ = workflow.Await(ctx, func() bool { return s.state.Phase == PhaseStopped })
		return s.state, nil
	}
	if err := workflow.Await(ctx, func() bool {
		return s.state.Phase != PhaseCreating && s.state.Phase != PhasePausing && s.state.Phase != PhaseResuming
	}); err != nil {
		return nil, err
	}
	s.state.Phase = PhaseStopping
	cctx := cleanupOptions(ctx, s.queue())
	if err := workflow.ExecuteActivity(cctx, ActRemoveSandbox, s.id()).Get(ctx, nil); err != nil {
		return nil, err
	}
	s.state.Sessions = map[string]*SessionRecord{}
	s.state.Phase = PhaseStopped
	return s.state, nil
}
