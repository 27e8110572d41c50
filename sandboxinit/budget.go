package sandboxinit

import (
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// Defaults of the daemon's budgets (Config). The command engine enforces
// its own two (running commands, retained output); these are the
// daemon's.
const (
	DefaultMaxSessions     = 256
	DefaultMaxPublishBytes = 1 << 30
)

// admitSession reserves a place for one more session, or refuses with
// resource_exhausted when the sandbox has MaxSessions (live ones and ones
// being created). The returned func gives the reservation back; the session
// itself counts from when it is in d.sessions.
func (d *Daemon) admitSession() (func(), error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.sessions) + d.creating; n >= d.cfg.MaxSessions {
		return nil, api.Errorf(api.KindResourceExhausted, map[string]any{"limit": "max_sessions", "max": d.cfg.MaxSessions},
			"the sandbox already has %d workspace sessions (max_sessions); destroy or publish some first", n)
	}
	d.creating++
	return func() {
		d.mu.Lock()
		d.creating--
		d.mu.Unlock()
	}, nil
}

// checkPublishSize refuses a change set whose files add up to more than
// MaxPublishBytes, before anything is frozen or written.
func (d *Daemon) checkPublishSize(s *session, cs *layerstack.ChangeSet) error {
	var total int64
	for _, c := range cs.Changes {
		total += c.Size + int64(len(c.Data)) + int64(len(c.Target))
	}
	if total <= d.cfg.MaxPublishBytes {
		return nil
	}
	return api.Errorf(api.KindResourceExhausted, map[string]any{"limit": "max_publish_bytes", "max": d.cfg.MaxPublishBytes,
		"change_set_bytes": total, "workspace_session_id": s.rec.ID, "session_retained": true},
		"the change set of %s has %d bytes, more than max_publish_bytes (%d); publish smaller parts from separate sessions or delete large generated files",
		s.rec.ID, total, d.cfg.MaxPublishBytes)
}
