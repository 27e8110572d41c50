package sandboxinit

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
)

// capture reads a session's upper dir as a change set with the session's
// processes frozen (its background processes keep running otherwise, and
// could swap what is read), and returns it with release, which closes the
// change set and thaws the session. Run release on every path (defer) once
// the change set's sources have been read (the store's Publish, Diff,
// CheckPublish and Refresh copy or read them before they return); it is
// idempotent. Freezing is defence in depth: the capture and every later
// read go by descriptors beneath the upper dir, so even unfrozen nothing
// outside it is ever read.
func (d *Daemon) capture(ctx context.Context, s *session) (*layerstack.ChangeSet, func(), error) {
	thaw := d.freeze(ctx, s)
	cs, err := layerstack.Capture(s.upper())
	if err != nil {
		thaw()
		if !d.live(s) {
			return nil, nil, errSessionNotFound(s.rec.ID) // destroyed meanwhile
		}
		return nil, nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "stage": "capture", "session_retained": true},
			"capture failed: %s", d.confine(s, err))
	}
	var once sync.Once
	return cs, func() {
		once.Do(func() {
			cs.Close()
			thaw()
		})
	}, nil
}

// maxFreeze bounds how long a capture keeps a session frozen. Safety does
// not depend on the freeze (every read is by descriptor), so a capture
// that overruns (a huge tree, a store operation stuck on a lock) thaws the
// session rather than leave its processes stopped.
const maxFreeze = 30 * time.Second

// freeze freezes the session's processes and returns the thaw.
func (d *Daemon) freeze(ctx context.Context, s *session) func() {
	rt := s.seen().rt
	if rt == nil {
		return func() {}
	}
	thaw, err := rt.Freeze()
	if errors.Is(err, runtime.ErrFreezeUnkillable) {
		return func() {} // cgroup v1: reads by descriptors only
	}
	if err != nil {
		d.log.WarnContext(ctx, "session not frozen for capture; reading it by descriptors only", "workspace_session_id", s.rec.ID, "err", err)
		return func() {}
	}
	watchdog := time.AfterFunc(maxFreeze, func() {
		d.log.Warn("capture kept the session frozen too long; thawed", "workspace_session_id", s.rec.ID, "limit", maxFreeze.String())
		thaw()
	})
	return func() {
		watchdog.Stop()
		thaw()
	}
}
