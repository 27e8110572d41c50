package sandboxinit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// activity tracks a session's last use for idle reaping.
type activity struct{ last atomic.Int64 }

func (a *activity) touch()               { a.last.Store(time.Now().UnixNano()) }
func (a *activity) since() time.Duration { return time.Since(time.Unix(0, a.last.Load())) }

// ArchiveIdleArgs are archive_idle_sessions' arguments.
type ArchiveIdleArgs struct {
	IdleForMS int64 `json:"idle_for_ms"`
}

// ArchivedSession describes a reaped session whose unpublished changes were
// kept under <state>/archive.
// ArchivedSession is the wire type (api.ArchivedSession).
type ArchivedSession = api.ArchivedSession

// archiveIdle reaps sessions without running commands that were not used
// for IdleForMS. A session with unpublished changes is archived (its upper
// dir and record move to the archive), never deleted.
func (d *Daemon) archiveIdle(ctx context.Context, a ArchiveIdleArgs) (*api.ArchiveResult, error) {
	if a.IdleForMS <= 0 {
		a.IdleForMS = int64(time.Hour / time.Millisecond)
	}
	idle := time.Duration(a.IdleForMS) * time.Millisecond
	d.mu.Lock()
	var cands []*session
	for _, s := range d.sessions {
		if s.act.since() >= idle {
			cands = append(cands, s)
		}
	}
	d.mu.Unlock()
	out := []ArchivedSession{}
	for _, s := range cands {
		s.gate.Lock()
		if !d.live(s) || len(d.cmds.Active(s.rec.ID)) > 0 || s.state != StateActive || s.act.since() < idle {
			s.gate.Unlock()
			continue
		}
		arch, err := d.archive(ctx, s)
		s.gate.Unlock()
		if err != nil {
			d.log.Error("archive idle session", "workspace_session_id", s.rec.ID, "err", err)
			continue
		}
		if arch != nil {
			out = append(out, *arch)
		}
		d.event(ctx, "workspace_session.reaped", map[string]any{"workspace_session_id": s.rec.ID, "archived": arch != nil})
	}
	return &api.ArchiveResult{Archived: out}, nil
}

// archive stops the session, keeps its upper dir (if it holds anything) in
// the archive, and removes the rest.
func (d *Daemon) archive(ctx context.Context, s *session) (*ArchivedSession, error) {
	if err := d.stop(ctx, s); err != nil {
		return nil, err
	}
	var arch *ArchivedSession
	if bytes := dirBytes(s.upper()); bytes > 0 || !dirEmpty(s.upper()) {
		now := time.Now().UTC()
		dst := filepath.Join(d.cfg.StateDir, "archive", s.rec.ID+"-"+now.Format("20060102T150405"))
		if err := os.MkdirAll(dst, 0o700); err != nil {
			return nil, err
		}
		if err := os.Rename(s.upper(), filepath.Join(dst, "upper")); err != nil {
			return nil, err
		}
		_ = os.Rename(filepath.Join(s.dir, "session.json"), filepath.Join(dst, "session.json"))
		arch = &ArchivedSession{ID: s.rec.ID, Path: dst, Archived: now, Bytes: bytes}
	}
	_, err := d.teardown(ctx, s, true)
	return arch, err
}

func dirEmpty(dir string) bool {
	ents, err := os.ReadDir(dir)
	return err != nil || len(ents) == 0
}

// listArchived lists archived sessions.
func (d *Daemon) listArchived() []ArchivedSession {
	root := filepath.Join(d.cfg.StateDir, "archive")
	ents, _ := os.ReadDir(root)
	out := []ArchivedSession{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue // dirs moved aside for removal
		}
		var rec sessionRecord
		p := filepath.Join(root, e.Name())
		_ = readJSON(filepath.Join(p, "session.json"), &rec)
		fi, _ := e.Info()
		a := ArchivedSession{ID: rec.ID, Path: p, Bytes: dirBytes(filepath.Join(p, "upper"))}
		if fi != nil {
			a.Archived = fi.ModTime().UTC()
		}
		out = append(out, a)
	}
	return out
}
