package gateway

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"
	tclient "go.temporal.io/sdk/client"

	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/lifecycle"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// Standby sandboxes (workflows/standby.go): after a create_sandbox of an
// image on a host, the gateway starts one more sandbox of that image there,
// empty and unlisted, and the next create_sandbox of the image claims it,
// so it pays only the workspace import. One standby per image and host;
// it removes itself when nobody claims it within StandbyTTL, and the
// gateway removes its standbys when it shuts down. Beside them, one spare
// per host (the key with no image): a standby of no image, its network and
// state volume made, which a create of an image with no standby claims, so
// the first create of an image does not wait for Docker to make a network.
// The gateway starts its host's spare when it starts, and every create
// starts the next.

// DefaultStandbyDelay is how long after a create the gateway waits before
// it starts the next standby, so the new sandbox's first commands do not
// share the CPU with Docker making it.
const DefaultStandbyDelay = 2 * time.Second

// SpareTTL is how long an unclaimed spare waits (a standby of an image
// waits StandbyOptions.TTL).
const SpareTTL = 24 * time.Hour

// StandbyOptions turn standby sandboxes on (the zero value is off).
type StandbyOptions struct {
	Enabled bool
	TTL     time.Duration // unclaimed this long, a standby removes itself (0 = workflows.DefaultStandbyTTL)
	Delay   time.Duration // after a create, before the next standby starts (0 = DefaultStandbyDelay, <0 = none)
	// Owner names this gateway's standbys, the same across its restarts
	// ("" = its workers' host queue and host name).
	Owner string
	// AdoptPatience bounds how long a restarted gateway keeps asking the
	// standbys its previous run left for their state (0 = DefaultAdoptPatience).
	AdoptPatience time.Duration
}

type standbyKey struct{ image, queue string }

// standbys is the gateway's pool: the standby (or the one being made) of
// each image and host.
type standbys struct {
	mu      sync.Mutex
	ids     map[standbyKey]string
	filling map[standbyKey]bool
	wg      sync.WaitGroup
	closed  bool
}

// StandbyInfo is one standby of the pool (health, tests, the benchmark).
type StandbyInfo struct {
	SandboxID string `json:"sandbox_id"`
	Image     string `json:"image"`
	HostQueue string `json:"host_queue,omitempty"`
	// State is the standby's phase: creating while Docker makes it,
	// standby once it waits for a claim.
	State string `json:"state"`
}

func (b *TemporalBackend) pool() *standbys {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.standby == nil {
		b.standby = &standbys{ids: map[standbyKey]string{}, filling: map[standbyKey]bool{}}
	}
	return b.standby
}

// take removes and returns the standby of key ("" = none).
func (p *standbys) take(k standbyKey) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := p.ids[k]
	delete(p.ids, k)
	return id
}

// giveBack returns a standby take handed out that still waits unclaimed
// to the pool: true, unless the pool is closed or has another of k now.
func (p *standbys) giveBack(k standbyKey, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ids[k] != "" || p.filling[k] {
		return false
	}
	p.ids[k] = id
	return true
}

// perQueue counts the pool's standbys of images on each host queue: the
// sandbox containers a host's count includes that are no one's yet (a
// spare has no container).
func (p *standbys) perQueue() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[string]int{}
	for k := range p.ids {
		if k.image != "" {
			n[k.queue]++
		}
	}
	return n
}

// claimStandby serves a create_sandbox from the standby of its image and
// host, when there is one. ok false: there was none, or it could not serve
// (another gateway took it, it failed or ended); the caller then creates
// the usual way. ok true: st or err is the create's answer (an import
// failure is the create's failure, as it would have been without it).
func (b *TemporalBackend) claimStandby(ctx context.Context, k standbyKey, r workflows.ClaimRequest, progress func(string)) (st *workflows.SandboxState, ok bool, err error) {
	if !b.Standby.Enabled {
		return nil, false, nil
	}
	id := b.pool().take(k)
	if id == "" {
		return nil, false, nil
	}
	progress("claiming standby sandbox " + id)
	// Accepted first: until the workflow accepts the claim nothing of the
	// create happened, so any failure up to there (refused, gone, Temporal
	// unreachable for a moment) falls back to the usual create.
	h, err := lifecycle.Send(ctx, b.Client, tclient.UpdateWorkflowOptions{WorkflowID: workflows.SandboxWorkflowID(id),
		UpdateName: workflows.UpdateClaim, Args: []any{r}, WaitForStage: tclient.WorkflowUpdateStageAccepted})
	if err != nil {
		b.log().Info("standby not claimed; creating anew", "sandbox_id", id, "error", err)
		go b.dropStandby(id) // released unless someone claimed it; it also ends by its TTL
		return nil, false, nil
	}
	var out workflows.SandboxState
	if err := h.Get(ctx, &out); err != nil {
		if e, ok := apperr.From(err); ok && e.Kind == workflows.KindStandbyUnavailable {
			// The standby ended (stopped, failed) before taking the claim,
			// or refused it and waits on (a spare asked for an image its
			// host does not have): that one stays in the pool.
			if kept, _ := e.Details[workflows.DetailStandbyKept].(bool); kept && !b.pool().giveBack(k, id) {
				go b.dropStandby(id)
			}
			return nil, false, nil
		}
		return nil, true, err
	}
	progress("sandbox " + id + " ready")
	return &out, true, nil
}

// standbyUnusable: the update found no unclaimed standby (refused, or the
// standby's workflow is gone).
func standbyUnusable(err error) bool {
	if e, ok := apperr.From(err); ok && e.Kind == workflows.KindStandbyUnavailable {
		return true
	}
	var nf *serviceerror.NotFound
	return errors.As(err, &nf)
}

// refillStandby starts the next standby of key (after the delay), unless
// the pool has one or is making one.
func (b *TemporalBackend) refillStandby(k standbyKey) {
	if !b.Standby.Enabled {
		return
	}
	p := b.pool()
	p.mu.Lock()
	if p.closed || p.ids[k] != "" || p.filling[k] {
		p.mu.Unlock()
		return
	}
	p.filling[k] = true
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		delay := b.Standby.Delay
		if delay == 0 {
			delay = DefaultStandbyDelay
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			p.mu.Lock()
			delete(p.filling, k)
			p.mu.Unlock()
			return
		}
		id := "eos-" + client.NewRequestID()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ttl := b.Standby.TTL
		if k.image == "" {
			// A spare holds no container: it waits for the first create of
			// an image for a day at least (a gateway that stops releases
			// it; one killed takes it back when it starts again).
			ttl = max(ttl, SpareTTL)
		}
		_, err := lifecycle.Start(ctx, b.Client, workflows.SandboxInput{HostQueue: k.queue, Standby: true, StandbyTTL: ttl,
			Spec: workflows.SandboxSpec{SandboxID: id, Image: k.image}},
			map[string]any{workflows.MemoStandby: true, "image": k.image, memoStandbyOwner: b.standbyOwner()})
		p.mu.Lock()
		delete(p.filling, k)
		keep := err == nil && !p.closed && p.ids[k] == "" // an adopted one may have come in meanwhile
		if keep {
			p.ids[k] = id
		}
		p.mu.Unlock()
		switch {
		case err != nil:
			b.log().Warn("start standby sandbox", "image", k.image, "error", err)
		case !keep:
			b.dropStandby(id)
		}
	}()
}

// memoStandbyOwner names the gateway that made a standby: after a crash
// it takes back its own, never another live gateway's.
const memoStandbyOwner = "standby_owner"

// standbyOwner is this gateway's name for its standbys: its workers' host
// queue and host name, the same after a restart.
func (b *TemporalBackend) standbyOwner() string {
	if b.Standby.Owner != "" {
		return b.Standby.Owner
	}
	return b.LocalQueue + "@" + b.LocalName
}

// dropStandby releases a standby the pool gave up (best effort: unclaimed,
// it also ends by its TTL; claimed meanwhile, it is left alone).
func (b *TemporalBackend) dropStandby(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.destroyStandbys(ctx, []string{id})
}

// StandbyPending: a standby is about to start (the pool waits out its
// delay or starts its workflow).
func (b *TemporalBackend) StandbyPending() bool {
	p := b.pool()
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.filling) > 0
}

// DropStandbys destroys the pool's standbys of images and keeps the pool
// open and its spares: the next create of an image is as the first one
// (it claims the spare), and starts another standby.
func (b *TemporalBackend) DropStandbys() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.destroyStandbys(ctx, b.pool().takeAll(false, false))
}

// StartSpare starts the spare of the host a create without a host would
// be placed on, unless the pool has it (at the gateway's start, after
// AdoptStandbys).
func (b *TemporalBackend) StartSpare(ctx context.Context) error {
	if !b.Standby.Enabled {
		return nil
	}
	queue, err := b.place(ctx, "", false)
	if err != nil {
		return err
	}
	b.refillStandby(standbyKey{queue: queue})
	return nil
}

// takeAll empties the pool (but its spares, unless spares); close also
// keeps it empty from now on.
func (p *standbys) takeAll(close, spares bool) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = p.closed || close
	ids := make([]string, 0, len(p.ids))
	for k, id := range p.ids {
		if k.image == "" && !spares {
			continue
		}
		ids = append(ids, id)
		delete(p.ids, k)
	}
	return ids
}

// destroyStandbys releases the standbys side by side: release_standby
// removes a standby nobody claimed and refuses one that is a user's
// sandbox now, so this never removes a user's work.
func (b *TemporalBackend) destroyStandbys(ctx context.Context, ids []string) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			if err := lifecycle.Update(ctx, b.Client, id, workflows.UpdateRelease, "", nil); err != nil && !standbyUnusable(err) {
				b.log().Warn("release standby sandbox", "sandbox_id", id, "error", err)
			}
		}(id)
	}
	wg.Wait()
}

// Standbys lists the pool with each standby's phase.
func (b *TemporalBackend) Standbys(ctx context.Context) []StandbyInfo {
	p := b.pool()
	p.mu.Lock()
	var out []StandbyInfo
	for k, id := range p.ids {
		out = append(out, StandbyInfo{SandboxID: id, Image: k.image, HostQueue: k.queue})
	}
	p.mu.Unlock()
	for i := range out {
		out[i].State = "unknown"
		if st, err := b.state(ctx, out[i].SandboxID); err == nil {
			out[i].State = st.Phase
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Image < out[j].Image })
	return out
}

// AdoptStandbys takes into the pool the standbys a previous run of this
// gateway left (killed before it could remove them): one per image and
// host; the rest are released. Other gateways' standbys are left alone.
// Right after a restart a standby's state may not be readable yet (its
// workflow waits for a worker to replay it, or Temporal is still coming
// up): the standbys not settled are asked again, with backoff, until each
// is adopted or released, AdoptPatience passes or ctx ends. Those still
// unsettled then are asked on in the background every adoptLateEvery until
// they settle or ctx ends: one that answers late is adopted if the pool
// has no standby for it by then, released otherwise, so none is left out
// of the pool running until its TTL.
func (b *TemporalBackend) AdoptStandbys(ctx context.Context) error {
	if !b.Standby.Enabled {
		return nil
	}
	patience := b.Standby.AdoptPatience
	if patience <= 0 {
		patience = DefaultAdoptPatience
	}
	deadline := time.Now().Add(patience)
	settled := map[string]bool{}
	for wait := 200 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		left, err := b.adoptStandbys(ctx, settled)
		if err == nil && len(left) == 0 {
			return nil
		}
		if time.Now().Add(wait).After(deadline) {
			if err == nil {
				err = fmt.Errorf("the state of standby sandboxes %v could not be read in %s; asking again every %s", left, patience, adoptLateEvery)
			}
			go b.adoptLate(ctx, settled)
			return err
		}
		b.log().Info("standby sandboxes left by a previous run: not all settled yet; asking again", "left", left, "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// DefaultAdoptPatience is how long AdoptStandbys keeps asking.
const DefaultAdoptPatience = 2 * time.Minute

// adoptLateEvery is how often the standbys AdoptStandbys gave up on are
// asked again in the background.
var adoptLateEvery = 30 * time.Second

// adoptLate asks again, every adoptLateEvery, for the standbys of a
// previous run not in settled, until none is left or ctx ends.
func (b *TemporalBackend) adoptLate(ctx context.Context, settled map[string]bool) {
	everyTick(ctx, adoptLateEvery, func() bool {
		left, err := b.adoptStandbys(ctx, settled)
		if err == nil && len(left) == 0 {
			b.log().Info("standby sandboxes left by a previous run: all settled")
			return false
		}
		return true
	})
}

// adoptStandbys is one pass of AdoptStandbys over this gateway's standbys
// not settled yet; it returns those whose state it could not read.
func (b *TemporalBackend) adoptStandbys(ctx context.Context, settled map[string]bool) (left []string, err error) {
	list, err := b.listSandboxWorkflows(ctx)
	if err != nil {
		return nil, err
	}
	mine := list[:0]
	for _, f := range list {
		// A claimed standby's memo says standby false; one with the flag
		// still on may have been claimed just now: its state decides.
		owner, _ := f.Memo[memoStandbyOwner].(string)
		if standby, _ := f.Memo[workflows.MemoStandby].(bool); standby && owner == b.standbyOwner() && !settled[f.ID] {
			mine = append(mine, f)
		}
	}
	b.each(ctx, mine, func(ctx context.Context, f *fleetEntry) { f.State, f.Err = b.state(ctx, f.ID) })
	p := b.pool()
	for _, f := range mine {
		if f.State == nil {
			left = append(left, f.ID) // one that ended meanwhile is not listed in the next pass
			continue
		}
		if f.State.Claiming {
			// A spare checking a claim's image (its gateway died with the
			// create): claimed or a standby again in a moment.
			left = append(left, f.ID)
			continue
		}
		settled[f.ID] = true
		if !f.State.Standby {
			continue // claimed: a user's sandbox now
		}
		image, _ := f.Memo["image"].(string)
		k := standbyKey{image: image, queue: f.State.HostQueue}
		p.mu.Lock()
		keep := !p.closed && p.ids[k] == "" && !p.filling[k] &&
			(f.State.Phase == workflows.PhaseStandby || f.State.Phase == workflows.PhaseCreating)
		if keep {
			p.ids[k] = f.ID
		}
		p.mu.Unlock()
		if !keep {
			b.dropStandby(f.ID)
		}
	}
	return left, nil
}

// CloseStandbys removes the pool's standbys (at shutdown): nothing stays
// behind on the host once the gateway stops.
func (b *TemporalBackend) CloseStandbys(ctx context.Context) {
	p := b.pool()
	b.destroyStandbys(ctx, p.takeAll(true, true))
	p.wg.Wait()
}
