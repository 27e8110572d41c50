package workflows

import (
	"encoding/json"
	"sort"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// Lifecycle users turn on: a sandbox TTL (past it the sandbox is paused,
// never deleted), idle-session archiving, pause and resume, restoring an
// archived session. Everything here is new state and new updates: a run
// recorded before them never takes these paths, so it replays unchanged.

// Updates of the sandbox lifecycle (the catalog's operation names).
const (
	UpdatePause          = "pause_sandbox"
	UpdateResume         = "resume_sandbox"
	UpdateRestoreSession = "restore_workspace_session"
)

// Phases of a paused sandbox: its container is stopped, its volumes kept.
const (
	PhasePausing  = "pausing"
	PhasePaused   = "paused"
	PhaseResuming = "resuming"
)

// Who paused a sandbox (LifecycleState.PausedBy).
const (
	PausedByUser = "user"
	PausedByTTL  = "ttl"
)

// LifecycleState is the sandbox's lifecycle settings and pause state
// (part of SandboxState, so it survives continue-as-new).
type LifecycleState struct {
	// TTL pauses the sandbox this long after creation or its last resume
	// (0 = never); ExpiresAt is when, while it runs.
	TTL       time.Duration `json:"ttl,omitempty"`
	ExpiresAt *time.Time    `json:"expires_at,omitempty"`
	// SessionIdleTTL archives sessions unused for this long (0 = never).
	SessionIdleTTL time.Duration `json:"session_idle_ttl,omitempty"`
	PausedAt       *time.Time    `json:"paused_at,omitempty"`
	PausedBy       string        `json:"paused_by,omitempty"`
	ResumedAt      *time.Time    `json:"resumed_at,omitempty"`
	Pauses         int           `json:"pauses,omitempty"`
	// TTLPostponed counts the TTL pauses a running publish held back (each
	// tried again expireRetry later).
	TTLPostponed int `json:"ttl_postponed,omitempty"`
}

// LifecycleResult answers pause_sandbox and resume_sandbox.
type LifecycleResult struct {
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
	// Already: the sandbox was in that state; nothing was done.
	Already   bool              `json:"already"`
	Message   string            `json:"message"`
	PausedAt  *time.Time        `json:"paused_at,omitempty"`
	PausedBy  string            `json:"paused_by,omitempty"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	Daemon    *api.Endpoint     `json:"daemon,omitempty"`
	Sessions  []api.SessionInfo `json:"workspace_sessions,omitempty"`
}

// checkLifecycleInput validates the durations a workflow is started with
// (the gateway checked them too; a workflow trusts no caller).
func checkLifecycleInput(in SandboxInput) error {
	if e := api.CheckTTL("ttl", in.SandboxTTL); e != nil {
		return apperr.New(e)
	}
	if e := api.CheckTTL("session_idle_ttl", in.SessionTTL); e != nil {
		return apperr.New(e)
	}
	return nil
}

// trackedUpdates are the handlers a pause waits for: they were accepted
// while the sandbox ran and use its daemon.
var trackedUpdates = map[string]bool{
	UpdateCreateSession: true, UpdateDestroySession: true, UpdatePublish: true, UpdateRefresh: true,
	UpdateAmend: true, UpdateSquash: true, UpdateExport: true, UpdateRestoreSession: true,
}

// registerLifecycle records the lifecycle settings of a new sandbox and
// registers the pause, resume and restore updates.
func (s *sandbox) registerLifecycle(ctx workflow.Context) error {
	if s.state.Lifecycle == nil {
		s.state.Lifecycle = newLifecycle(s.state.Created, s.in.SandboxTTL, s.in.SessionTTL)
	}
	for _, h := range []struct {
		name     string
		fn, vali any
	}{
		{UpdatePause, s.pause, s.validatePause},
		{UpdateResume, s.resume, s.validateResume},
		{UpdateRestoreSession, s.restoreSession, s.validateRestore},
	} {
		if err := s.handle(ctx, h.name, h.fn, h.vali); err != nil {
			return err
		}
	}
	return nil
}

// newLifecycle is the lifecycle of a sandbox created at created.
func newLifecycle(created time.Time, ttl, idle time.Duration) *LifecycleState {
	lc := &LifecycleState{TTL: ttl, SessionIdleTTL: idle}
	if ttl > 0 {
		at := created.Add(ttl)
		lc.ExpiresAt = &at
	}
	return lc
}

// wake makes the run loop recompute its timer (a pause or resume changed
// what it waits for).
func (s *sandbox) wake() { s.wakeRev++ }

// nextWake is how long the run loop sleeps: until the TTL expires when
// that is sooner than wait; a paused sandbox reaps nothing and expires
// never, so it sleeps a day (a resume wakes it).
func (s *sandbox) nextWake(ctx workflow.Context, wait time.Duration) time.Duration {
	switch s.state.Phase {
	case PhasePaused, PhasePausing, PhaseResuming:
		return 24 * time.Hour
	}
	lc := s.state.Lifecycle
	if lc == nil || lc.ExpiresAt == nil || s.state.Phase != PhaseReady {
		return wait
	}
	until := lc.ExpiresAt.Sub(workflow.Now(ctx))
	if until < time.Millisecond {
		until = time.Millisecond
	}
	if s.expirePostponed {
		// A publish held the TTL's pause back: try again in a while, not
		// in a loop of short timers.
		until = max(until, expireRetry)
	}
	return min(until, wait)
}

// expire pauses a sandbox whose TTL has passed (never deletes it).
func (s *sandbox) expire(ctx workflow.Context) {
	lc := s.state.Lifecycle
	if lc == nil || lc.ExpiresAt == nil || s.state.Phase != PhaseReady || workflow.Now(ctx).Before(*lc.ExpiresAt) {
		return
	}
	_, err := s.doPause(ctx, PausedByTTL)
	s.expirePostponed = err != nil
	if err != nil {
		lc.TTLPostponed++
		// A publish still running (or a failed stop): a later wake tries
		// again.
		s.log.Info("ttl pause postponed", "sandbox_id", s.id(), "error", err)
	}
}

// expireRetry is how long a TTL pause held back by a publish waits before
// it tries again.
const expireRetry = 5 * time.Second

// errPaused is the refusal of an operation that needs the sandbox to run
// while it is paused (or pausing, resuming); nil otherwise.
func (s *sandbox) errPaused() error {
	switch s.state.Phase {
	case PhasePaused, PhasePausing, PhaseResuming:
		return apperr.New(pausedError(s.id(), s.state.Phase))
	}
	return nil
}

// pausedError is what every door answers for a paused sandbox.
func pausedError(id, phase string) *api.Error {
	return api.Errorf(api.KindFailedPrecondition, map[string]any{"sandbox_id": id, "state": phase, "hint": "resume_sandbox"},
		"sandbox %s is %s: its container is stopped (volumes and sessions kept); resume_sandbox --sandbox-id %s brings it back", id, phase, id)
}

// PausedError is pausedError for the gateway.
func PausedError(id, phase string) *api.Error { return pausedError(id, phase) }

// IsPausedPhase reports whether a phase is one of a paused sandbox's.
func IsPausedPhase(phase string) bool {
	return phase == PhasePaused || phase == PhasePausing || phase == PhaseResuming
}

func (s *sandbox) validatePause() error {
	switch s.state.Phase {
	case PhaseReady:
		if ids := s.publishingIDs(); len(ids) > 0 {
			return apperr.Newf(api.KindOperationConflict, map[string]any{"sandbox_id": s.id(), "publishing": ids, "retry": true},
				"sandbox %s is publishing workspace session %s: a pause would stop the container in the middle of the publish; pause again when it has ended", s.id(), ids[0])
		}
		return nil
	case PhasePaused, PhasePausing:
		return nil
	case PhaseResuming:
		return apperr.Newf(api.KindOperationConflict, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase, "retry": true},
			"sandbox %s is being resumed; pause it when the resume has ended", s.id())
	}
	return apperr.Newf(api.KindFailedPrecondition, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase}, "sandbox %s is %s: only a running sandbox can be paused", s.id(), s.state.Phase)
}

func (s *sandbox) validateResume() error {
	switch s.state.Phase {
	case PhasePaused, PhaseResuming, PhaseReady:
		return nil
	case PhasePausing:
		return apperr.Newf(api.KindOperationConflict, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase, "retry": true},
			"sandbox %s is being paused; resume it when the pause has ended", s.id())
	}
	return apperr.Newf(api.KindFailedPrecondition, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase}, "sandbox %s is %s: only a paused sandbox can be resumed", s.id(), s.state.Phase)
}

func (s *sandbox) publishingIDs() []string {
	ids := make([]string, 0, len(s.publishing))
	// Sorted below: the order of the map does not reach any command.
	//workflowcheck:ignore
	for id := range s.publishing {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (s *sandbox) pause(ctx workflow.Context) (*LifecycleResult, error) {
	return s.doPause(ctx, PausedByUser)
}

// doPause stops the container once the operations accepted before it have
// ended; the state volume (layers, sessions, their unpublished work) stays.
// A failed stop leaves the sandbox running, as it was.
func (s *sandbox) doPause(ctx workflow.Context, by string) (*LifecycleResult, error) {
	switch s.state.Phase {
	case PhasePaused:
		return s.lifecycleResult(true, "sandbox is already paused"), nil
	case PhasePausing:
		if err := workflow.Await(ctx, func() bool { return s.state.Phase != PhasePausing }); err != nil {
			return nil, err
		}
		if s.state.Phase == PhasePaused {
			return s.lifecycleResult(true, "sandbox is already paused"), nil
		}
		return nil, apperr.Newf(api.KindOperationFailed, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase}, "the pause of sandbox %s did not complete; it is %s", s.id(), s.state.Phase)
	case PhaseReady:
	default:
		return nil, apperr.Newf(api.KindFailedPrecondition, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase}, "sandbox %s is %s: only a running sandbox can be paused", s.id(), s.state.Phase)
	}
	if by == PausedByTTL && len(s.publishing) > 0 {
		return nil, apperr.Newf(api.KindOperationConflict, map[string]any{"publishing": s.publishingIDs()}, "a publish runs")
	}
	s.state.Phase = PhasePausing
	s.wake()
	// Operations accepted while it ran (a publish, a refresh, a session
	// create...) end first; new ones are refused from now on.
	if err := workflow.Await(ctx, func() bool { return s.busy == 0 && len(s.publishing) == 0 }); err != nil {
		return nil, err
	}
	if err := workflow.ExecuteActivity(dockerOptions(ctx, s.queue()), ActStopContainer, s.id()).Get(ctx, nil); err != nil {
		s.state.Phase = PhaseReady
		s.wake()
		return nil, err
	}
	now := workflow.Now(ctx).UTC()
	lc := s.state.Lifecycle
	s.state.Phase = PhasePaused
	s.state.Container.State = "exited"
	lc.PausedAt, lc.PausedBy = &now, by
	lc.Pauses++
	s.wake()
	s.log.Info("sandbox paused", "sandbox_id", s.id(), "by", by)
	return s.lifecycleResult(false, "sandbox paused: container stopped, volumes and sessions kept"), nil
}

// resume starts the container, waits for its daemon and records where it
// listens now; the daemon's boot brings the sessions back over their upper
// dirs. A failed start stops the container again: the sandbox stays
// paused, never half-running.
func (s *sandbox) resume(ctx workflow.Context) (*LifecycleResult, error) {
	switch s.state.Phase {
	case PhaseReady:
		return s.lifecycleResult(true, "sandbox is already running"), nil
	case PhaseResuming:
		if err := workflow.Await(ctx, func() bool { return s.state.Phase != PhaseResuming }); err != nil {
			return nil, err
		}
		if s.state.Phase == PhaseReady {
			return s.lifecycleResult(true, "sandbox is already running"), nil
		}
		return nil, apperr.Newf(api.KindOperationFailed, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase}, "the resume of sandbox %s did not complete; it is %s", s.id(), s.state.Phase)
	case PhasePaused:
	default:
		return nil, apperr.Newf(api.KindFailedPrecondition, map[string]any{"sandbox_id": s.id(), "state": s.state.Phase}, "sandbox %s is %s: only a paused sandbox can be resumed", s.id(), s.state.Phase)
	}
	s.state.Phase = PhaseResuming
	s.wake()
	dctx := dockerOptions(ctx, s.queue())
	var info ContainerInfo
	err := workflow.ExecuteActivity(dctx, ActStartContainer, s.id()).Get(ctx, &info)
	if err == nil {
		err = workflow.ExecuteActivity(dctx, ActWaitReady, s.id(), info.Daemon).Get(ctx, nil)
	}
	if err != nil {
		cctx, _ := workflow.NewDisconnectedContext(ctx)
		if serr := workflow.ExecuteActivity(dockerOptions(cctx, s.queue()), ActStopContainer, s.id()).Get(cctx, nil); serr != nil {
			s.log.Error("stop after a failed resume", "sandbox_id", s.id(), "error", serr)
		}
		s.state.Phase = PhasePaused
		s.wake()
		return nil, err
	}
	s.state.Container.ContainerID, s.state.Container.Daemon, s.state.Container.State = info.ContainerID, info.Daemon, info.State
	now := workflow.Now(ctx).UTC()
	lc := s.state.Lifecycle
	lc.PausedAt, lc.PausedBy, lc.ResumedAt = nil, "", &now
	if lc.TTL > 0 {
		at := now.Add(lc.TTL)
		lc.ExpiresAt = &at
	}
	s.state.Phase = PhaseReady
	s.wake()
	res := s.lifecycleResult(false, "sandbox resumed: sessions are back with their unpublished work")
	key := "resume"
	if u := workflow.GetCurrentUpdateInfo(ctx); u != nil {
		key = s.updateKey(ctx)
	}
	if out, err := s.call(ctx, "list_workspace_sessions", nil, key+"/sessions"); err == nil {
		var list struct {
			Sessions []api.SessionInfo `json:"workspace_sessions"`
		}
		if decode("list_workspace_sessions", out, &list) == nil {
			for _, si := range list.Sessions {
				if si.Implicit {
					continue
				}
				if si.State != "" && si.State != "active" {
					// Its restart at the daemon's boot failed (or a publish
					// was left unfinished): recover it, keeping its work.
					args, _ := json.Marshal(map[string]any{"workspace_session_id": si.WorkspaceSessionID})
					if rout, rerr := s.call(ctx, "recover_workspace_session", args, key+"/recover/"+si.WorkspaceSessionID); rerr == nil {
						var rec api.RecoverResult
						if decode("recover_workspace_session", rout, &rec) == nil && rec.State != "" {
							si.State = rec.State
							if rec.Destroyed { // its committed publish ended it
								delete(s.state.Sessions, si.WorkspaceSessionID)
							}
						}
					}
				}
				res.Sessions = append(res.Sessions, si)
			}
		}
	}
	return res, nil
}

func (s *sandbox) lifecycleResult(already bool, msg string) *LifecycleResult {
	lc := s.state.Lifecycle
	r := &LifecycleResult{SandboxID: s.id(), State: s.state.Phase, Already: already, Message: msg,
		PausedAt: lc.PausedAt, PausedBy: lc.PausedBy}
	if s.state.Phase == PhaseReady {
		r.ExpiresAt = lc.ExpiresAt
		d := s.state.Container.Daemon
		r.Daemon = &d
	}
	return r
}

func (s *sandbox) validateRestore(r SessionRequest) error {
	if err := s.validateReady(CreateSessionRequest{}); err != nil {
		return err
	}
	id := r.WorkspaceSessionID
	if id == "" || !api.ValidID(id) {
		return apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "workspace_session_id"}, "workspace_session_id must be an archived session's id, not %q", id)
	}
	if _, ok := s.state.Sessions[id]; ok {
		return apperr.Newf(api.KindFailedPrecondition, map[string]any{"workspace_session_id": id, "session_state": "active"},
			"workspace session %s is active, not archived: there is nothing to restore", id)
	}
	return nil
}

// restoreSession brings an archived session back as active with its work
// (the daemon moves it back over its kept base) and records it again.
func (s *sandbox) restoreSession(ctx workflow.Context, r SessionRequest) (json.RawMessage, error) {
	args, _ := json.Marshal(map[string]any{"workspace_session_id": r.WorkspaceSessionID})
	out, err := s.call(ctx, UpdateRestoreSession, args, s.updateKey(ctx))
	if err != nil {
		return nil, err
	}
	var res api.RestoreSessionResult
	if err := decode(UpdateRestoreSession, out, &res); err != nil {
		return nil, err
	}
	s.state.Sessions[res.WorkspaceSessionID] = &SessionRecord{ID: res.WorkspaceSessionID, NetworkProfile: res.NetworkProfile,
		Agent: res.Agent, Created: workflow.Now(ctx).UTC()}
	kept := s.state.Archived[:0]
	for _, a := range s.state.Archived {
		if a.ID != res.WorkspaceSessionID {
			kept = append(kept, a)
		}
	}
	s.state.Archived = kept
	return out, nil
}
