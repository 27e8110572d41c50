package sandboxinit

import "context"

// createOnce runs create for the create_workspace_session call rid, once:
// a call under the id of a session that exists answers that session, and
// one under the id of a create in flight waits for it, then answers what
// it made (or creates, if it made nothing). The sandbox workflow's retries
// and its fallback from a local call to an activity reuse the id, so a
// session is never made twice for one create. An empty rid creates.
func (d *Daemon) createOnce(ctx context.Context, rid string, create func() (*session, error)) (*session, error) {
	if rid == "" {
		return create()
	}
	for {
		d.mu.Lock()
		for _, s := range d.sessions {
			if s.rec.CreatedBy == rid {
				d.mu.Unlock()
				return s, nil
			}
		}
		wait, busy := d.creatingBy[rid]
		if !busy {
			if d.creatingBy == nil {
				d.creatingBy = map[string]chan struct{}{}
			}
			done := make(chan struct{})
			d.creatingBy[rid] = done
			d.mu.Unlock()
			defer func() {
				d.mu.Lock()
				delete(d.creatingBy, rid)
				d.mu.Unlock()
				close(done)
			}()
			return create()
		}
		d.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
