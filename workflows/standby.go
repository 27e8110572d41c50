package workflows

import (
	"errors"
	"path/filepath"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

// A standby sandbox is a sandbox workflow started ahead of any request
// (SandboxInput.Standby): it makes the network, the state volume and the
// container, starts the daemon and waits, empty and unlisted, for a
// create_sandbox of its image to claim it (UpdateClaim). The claim names
// the workspace; the workflow imports it and goes on as that sandbox, so
// the caller pays the import and not Docker's ~0.7 s of network, create
// and start. Unclaimed for StandbyTTL, it removes everything it made and
// ends. Everything here is new input, state and one new update: a run
// recorded before it never takes these paths, so it replays unchanged.

const (
	// PhaseStandby: started and waiting for a claim.
	PhaseStandby = "standby"
	// UpdateClaim makes a standby sandbox the caller's (ClaimRequest).
	UpdateClaim = "claim_standby"
	// UpdateRelease removes an unclaimed standby and only that: a standby
	// claimed in the meantime is refused (KindStandbyUnavailable), so a
	// gateway giving up its standby can never remove a user's sandbox.
	UpdateRelease = "release_standby"
	// DefaultStandbyTTL is how long an unclaimed standby waits.
	DefaultStandbyTTL = 10 * time.Minute
	// KindStandbyUnavailable: this standby cannot serve the claim (another
	// took it, it holds another image, it failed, expired or was
	// destroyed). The caller creates a sandbox the usual way instead.
	KindStandbyUnavailable = "standby_unavailable"
	// MemoStandby marks a standby's workflow (true until it is claimed).
	MemoStandby = "standby"
)

// A spare is a standby of no image (SandboxInput.Standby with an empty
// Spec.Image): its network and state volume only, which Docker takes
// ~100 ms to make; the claim of a create_sandbox of any image names the
// image, and the workflow makes the container from there. The gateway
// keeps one per host beside its standbys of images, so the first create
// of an image does not wait for a network either.
func (s *sandbox) spare() bool { return s.in.Standby && s.in.Spec.Image == "" }

// errStandbyEnded: the standby ended unclaimed (expired, destroyed, its
// container lost); the creation's compensation removed what it made.
var errStandbyEnded = errors.New("standby ended unclaimed")

// ClaimRequest is a create_sandbox served by a standby: what the gateway
// would have started a sandbox workflow with.
type ClaimRequest struct {
	Image         string `json:"image"`
	WorkspaceRoot string `json:"workspace_root"`
	// SandboxTTL and SessionTTL are the create's (SandboxInput's).
	SandboxTTL time.Duration `json:"sandbox_ttl,omitempty"`
	SessionTTL time.Duration `json:"session_ttl,omitempty"`
	// Memo is upserted as the workflow's memo (the record's
	// workspace_root, the request id), with standby false.
	Memo map[string]any `json:"memo,omitempty"`
}

func errStandby(s *sandbox, format string, a ...any) error {
	return apperr.Newf(KindStandbyUnavailable, map[string]any{"sandbox_id": s.id()}, format, a...)
}

// validateClaim admits a claim only of an unclaimed standby of the same
// image, with a workspace and TTLs a create would accept; the claim
// arrives from the gateway but is checked as if anyone sent it.
func (s *sandbox) validateClaim(r ClaimRequest) error {
	if err := s.validateUnclaimed(); err != nil {
		return err
	}
	if r.Image == "" {
		return apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "image"}, "claim: image is required")
	}
	if !s.spare() && r.Image != s.in.Spec.Image {
		return errStandby(s, "standby %s holds image %q, not %q", s.id(), s.in.Spec.Image, r.Image)
	}
	if r.WorkspaceRoot == "" || !filepath.IsAbs(r.WorkspaceRoot) || filepath.Clean(r.WorkspaceRoot) != r.WorkspaceRoot {
		return apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "workspace_root"}, "claim: workspace_root must be a clean absolute path, not %q", r.WorkspaceRoot)
	}
	return checkLifecycleInput(SandboxInput{SandboxTTL: r.SandboxTTL, SessionTTL: r.SessionTTL})
}

// validateUnclaimed admits a claim or a release only of a standby nobody
// claimed or released, that is being made or waits.
func (s *sandbox) validateUnclaimed() error {
	if !s.in.Standby || s.claim != nil || s.released || !s.state.Standby {
		return errStandby(s, "sandbox %s is not an unclaimed standby", s.id())
	}
	if s.state.Phase != PhaseCreating && s.state.Phase != PhaseStandby {
		return errStandby(s, "standby %s is %s", s.id(), s.state.Phase)
	}
	return nil
}

// releaseStandby ends an unclaimed standby: it removes what it made (the
// creation's compensation) and the update answers once it has.
func (s *sandbox) releaseStandby(ctx workflow.Context) error {
	if err := s.validateUnclaimed(); err != nil {
		return err
	}
	s.released = true
	return workflow.Await(ctx, func() bool { return s.state.Phase == PhaseStopped || s.state.Phase == PhaseFailed })
}

// claimStandby hands the claim to the creation (awaitClaim) and answers
// like wait_ready once the workspace is imported, or with
// KindStandbyUnavailable when the standby ended before taking it.
func (s *sandbox) claimStandby(ctx workflow.Context, r ClaimRequest) (*SandboxState, error) {
	if err := s.validateClaim(r); err != nil {
		return nil, err
	}
	s.claim = &r
	mine := s.claim
	if err := workflow.Await(ctx, func() bool {
		if _, ok := s.refused[mine]; ok {
			return true
		}
		if s.claimed {
			return s.state.Phase != PhaseCreating
		}
		return s.state.Phase != PhaseCreating && s.state.Phase != PhaseStandby
	}); err != nil {
		return nil, err
	}
	if err, ok := s.refused[mine]; ok {
		delete(s.refused, mine)
		return nil, err
	}
	if !s.claimed {
		return nil, errStandby(s, "standby %s ended (%s) before it was claimed", s.id(), s.state.Phase)
	}
	return s.waitReady(ctx)
}

// versionSpareChecksImage marks runs in which a spare checks a claim's
// image before it takes the claim (runs recorded before took it and
// checked the image in the creation).
const versionSpareChecksImage = "spare-checks-claim-image"

// DetailStandbyKept, true in a KindStandbyUnavailable refusal, says the
// standby refused this claim and still waits for one: the gateway keeps it.
const DetailStandbyKept = "standby_kept"

// checkClaimImage is a spare's look at its claim's image before it takes
// the claim. When the host does not have the image (or refuses the name)
// the claim is refused (refuse is true) as standby_unavailable with
// DetailStandbyKept: the gateway keeps the spare, whose network and
// volume nothing touched, and creates the usual way, which answers the
// missing image as it always has. An image check the host does not answer
// loses the spare (the gateway then creates anew). checked says the image
// was checked (the creation need not again).
func (s *sandbox) checkClaimImage(ctx workflow.Context) (checked, refuse bool) {
	if s.claim == nil || s.state.Phase != PhaseStandby || s.lost || s.released || !s.spare() ||
		workflow.GetVersion(ctx, versionSpareChecksImage, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		return false, false
	}
	s.state.Claiming = true
	err := workflow.ExecuteActivity(resolveOptions(ctx, s.queue()), ActCheckImage, s.claim.Image).Get(ctx, nil)
	s.state.Claiming = false
	if err == nil {
		return true, false
	}
	if e, ok := apperr.From(err); ok && e.Kind == api.KindInvalidRequest { // CheckImage's answer: not on this host, or no image name
		if s.refused == nil {
			s.refused = map[*ClaimRequest]error{}
		}
		s.refused[s.claim] = apperr.Newf(KindStandbyUnavailable, map[string]any{"sandbox_id": s.id(), "image": s.claim.Image, DetailStandbyKept: true},
			"spare %s does not serve image %q: %s", s.id(), s.claim.Image, e.Message)
		s.claim = nil
		return false, true
	}
	s.log.Info("spare's host did not answer the image check; not claimed", "sandbox_id", s.id(), "error", err)
	s.lost = true
	return false, false
}

// awaitClaim holds a started standby until a claim, a destroy, the loss of
// its container or StandbyTTL. Claimed, it makes the sandbox the
// claimant's (spec, TTLs, creation time, memo) and returns true; the
// creation then imports the workspace. Unclaimed, destroyed says a
// destroy_sandbox is removing it (else the creation's compensation must).
func (s *sandbox) awaitClaim(ctx workflow.Context) (claimed, imageChecked, destroyed bool, err error) {
	s.state.Phase = PhaseStandby
	ttl := s.in.StandbyTTL
	if ttl <= 0 {
		ttl = DefaultStandbyTTL
	}
	deadline := workflow.Now(ctx).Add(ttl)
	for wait := ttl; ; wait = deadline.Sub(workflow.Now(ctx)) {
		if s.claim == nil && wait > 0 {
			if _, err := workflow.AwaitWithTimeout(ctx, wait, func() bool {
				return s.claim != nil || s.released || s.state.Phase != PhaseStandby || s.lost
			}); err != nil {
				return false, false, false, err
			}
		}
		var refused bool
		if imageChecked, refused = s.checkClaimImage(ctx); !refused {
			break
		}
	}
	if s.claim != nil && s.state.Phase == PhaseStandby && !s.lost && !s.spare() {
		// Minutes may have passed: the container may have been stopped,
		// or restarted on another port. A standby that does not run now
		// is not handed out (the gateway then creates anew).
		var info ContainerInfo
		err := workflow.ExecuteActivity(resolveOptions(ctx, s.queue()), ActResolveDaemon, s.id()).Get(ctx, &info)
		if err == nil && info.State == "running" && info.Daemon.Port != 0 {
			s.state.Container = info
		} else {
			s.log.Info("standby not running; not claimed", "sandbox_id", s.id(), "state", info.State, "error", err)
			s.lost = true
		}
	}
	if s.claim == nil || s.released || s.state.Phase != PhaseStandby || s.lost {
		if s.state.Phase != PhaseStandby {
			return false, false, true, nil
		}
		s.state.Phase = PhaseStopping // no claim is admitted while it goes
		return false, false, false, nil
	}
	r := *s.claim
	if s.spare() {
		// Its image from now on; s.spare() is false from here.
		s.in.Spec.Image = r.Image
	}
	s.claimed, s.state.Standby = true, false
	s.in.Spec.WorkspaceRoot = r.WorkspaceRoot
	s.in.SandboxTTL, s.in.SessionTTL = r.SandboxTTL, r.SessionTTL
	s.state.Created = workflow.Now(ctx).UTC()
	s.state.Lifecycle = newLifecycle(s.state.Created, r.SandboxTTL, r.SessionTTL)
	s.state.Phase = PhaseCreating
	memo := r.Memo // decoded for this claim: ours to change
	if memo == nil {
		memo = map[string]any{}
	}
	memo[MemoStandby] = false
	if err := workflow.UpsertMemo(ctx, memo); err != nil {
		return false, false, false, err
	}
	s.wake()
	return true, imageChecked, false, nil
}
