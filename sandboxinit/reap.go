package sandboxinit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

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

// ArchivedSession is the wire type (api.ArchivedSession).
type ArchivedSession = api.ArchivedSession

// archiveRecord is <state>/archive/<entry>/archived.json: when and by
// which request a session was archived.
type archiveRecord struct {
	Archived time.Time `json:"archived_at"`
	By       string    `json:"archived_by,omitempty"`
}

// archiveIdle reaps sessions without running commands that were not used
// for IdleForMS: each is stopped and its whole session dir (upper dir,
// record) moves to the archive, keeping its lease, so it can be restored
// over the same base with its unpublished work (restoreArchived). The
// answer lists the sessions archived by this request id, including those
// an earlier attempt of the same request archived (a retried activity).
func (d *Daemon) archiveIdle(ctx context.Context, rid string, a ArchiveIdleArgs) (*api.ArchiveResult, error) {
	if a.IdleForMS < 0 {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "idle_for_ms"}, "idle_for_ms must not be negative")
	}
	if a.IdleForMS == 0 {
		a.IdleForMS = int64(time.Hour / time.Millisecond)
	}
	idle := time.Duration(a.IdleForMS) * time.Millisecond
	d.mu.Lock()
	var cands []*session
	for _, s := range d.sessions {
		if !s.rec.Implicit && s.act.since() >= idle {
			cands = append(cands, s)
		}
	}
	d.mu.Unlock()
	for _, s := range cands {
		s.gate.Lock()
		if !d.live(s) || len(d.cmds.Active(s.rec.ID)) > 0 || s.state != StateActive || s.act.since() < idle {
			s.gate.Unlock()
			continue
		}
		_, err := d.archive(ctx, s, rid)
		if err != nil && d.live(s) && s.seen().rt == nil {
			// Stopped but not archived: recover_workspace_session (or the
			// next boot) starts it again over its upper dir.
			s.setState(StateFinalizeFailed)
		}
		s.gate.Unlock()
		if err != nil {
			d.log.Error("archive idle session", "workspace_session_id", s.rec.ID, "err", err)
			continue
		}
		d.event(ctx, "workspace_session.archived", map[string]any{"workspace_session_id": s.rec.ID, "idle_for_ms": a.IdleForMS})
	}
	out := []ArchivedSession{}
	for _, arch := range d.listArchived() {
		if rid != "" && arch.ArchivedBy == rid {
			out = append(out, arch)
		}
	}
	return &api.ArchiveResult{Archived: out}, nil
}

// archive stops the session and moves its dir to the archive in one
// rename; its lease stays, so its base layers stay. A crash before the
// rename leaves an ordinary session (restored at boot), after it an
// archived one.
func (d *Daemon) archive(ctx context.Context, s *session, rid string) (*ArchivedSession, error) {
	if err := d.stop(ctx, s); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	if err := writeJSONAtomic(filepath.Join(s.dir, "archived.json"), archiveRecord{Archived: now, By: rid}); err != nil {
		return nil, err
	}
	dst := filepath.Join(d.cfg.StateDir, "archive", s.rec.ID+"-"+now.Format("20060102T150405.000000000"))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return nil, err
	}
	if err := os.Rename(s.dir, dst); err != nil {
		return nil, err
	}
	d.mu.Lock()
	delete(d.sessions, s.rec.ID)
	d.mu.Unlock()
	return &ArchivedSession{ID: s.rec.ID, Agent: s.rec.Agent, Path: dst, Archived: now, ArchivedBy: rid, Restorable: true}, nil
}

// listArchived lists archived sessions, oldest first.
func (d *Daemon) listArchived() []ArchivedSession {
	root := filepath.Join(d.cfg.StateDir, "archive")
	ents, _ := os.ReadDir(root)
	out := []ArchivedSession{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || !e.IsDir() {
			continue // dirs moved aside for removal
		}
		p := filepath.Join(root, e.Name())
		out = append(out, readArchive(p))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Archived.Before(out[j].Archived) })
	return out
}

// readArchive describes one archive entry. An entry without a valid
// session record (a session dir a daemon could not read at boot) is listed
// by its dir name, not restorable.
func readArchive(p string) ArchivedSession {
	var rec sessionRecord
	recErr := readJSON(filepath.Join(p, "session.json"), &rec)
	var ar archiveRecord
	if readJSON(filepath.Join(p, "archived.json"), &ar) != nil {
		if fi, err := os.Stat(p); err == nil {
			ar.Archived = fi.ModTime().UTC()
		}
	}
	a := ArchivedSession{ID: rec.ID, Agent: rec.Agent, Path: p, Archived: ar.Archived, ArchivedBy: ar.By,
		Restorable: recErr == nil && rec.ID != "" && api.ValidID(rec.ID)}
	if !a.Restorable {
		a.ID = filepath.Base(p)
	}
	upper := archivedUpper(p, rec)
	a.Bytes = dirBytes(upper)
	a.FilesChanged = countChanges(upper)
	return a
}

// archivedUpper is an archive entry's upper dir: the session's own (the
// whole session dir is archived) or "upper" (archives of older daemons).
func archivedUpper(p string, rec sessionRecord) string {
	if rec.Upper != "" && !strings.ContainsAny(rec.Upper, "/\\") && rec.Upper != "." && rec.Upper != ".." {
		if fi, err := os.Lstat(filepath.Join(p, rec.Upper)); err == nil && fi.IsDir() {
			return filepath.Join(p, rec.Upper)
		}
	}
	return filepath.Join(p, "upper")
}

// countChanges counts the non-directories of an upper dir (files,
// symlinks, whiteouts), by descriptors.
func countChanges(dir string) int {
	f, err := os.Open(dir)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	_ = walkAt(f, "", func(_ string, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			n++
		}
		return nil
	})
	return n
}

// findArchive returns the newest archive entry of session id ("" if none).
func (d *Daemon) findArchive(id string) (string, ArchivedSession) {
	var best ArchivedSession
	path := ""
	for _, a := range d.listArchived() {
		if a.Restorable && a.ID == id && (path == "" || !a.Archived.Before(best.Archived)) {
			best, path = a, a.Path
		}
	}
	return path, best
}

// restoreArchived brings an archived session back as active: its dir moves
// back under sessions/ in one rename and the session starts over its upper
// dir and its kept lease (a lease that is gone — an archive of an older
// daemon — is replaced by one on the current head, said as rebased). A
// retried request (the same request id) that already restored it answers
// the same; restoring a live session or an unknown id is refused and
// changes nothing.
func (d *Daemon) restoreArchived(ctx context.Context, rid string, a api.SessionArgs) (_ *api.RestoreSessionResult, retErr error) {
	ctx, sp := d.span(ctx, "workspace_session.restore", map[string]any{"workspace_session_id": a.WorkspaceSessionID})
	defer func() { sp.End(retErr); retErr = d.confineErr(retErr) }()
	id := a.WorkspaceSessionID
	if id == "" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "workspace_session_id"}, "workspace_session_id is required")
	}
	if !api.ValidID(id) {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "workspace_session_id"}, "%q is not a valid workspace_session_id", id)
	}
	if s, err := d.session(id); err == nil {
		if rid != "" && s.rec.RestoredBy == rid {
			return d.restoredResult(s, false), nil
		}
		return nil, api.Errorf(api.KindFailedPrecondition, map[string]any{"workspace_session_id": id, "session_state": s.seen().state},
			"workspace session %s is not archived: it is %s", id, s.seen().state)
	}
	src, arch := d.findArchive(id)
	if src == "" {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"workspace_session_id": id, "hint": "list_archived_sessions"},
			"no archived workspace session %s", id)
	}
	release, err := d.admitSession()
	if err != nil {
		return nil, err
	}
	defer release()
	s := &session{dir: filepath.Join(d.cfg.StateDir, "sessions", id), state: StateActive}
	if err := readJSON(filepath.Join(src, "session.json"), &s.rec); err != nil {
		return nil, fmt.Errorf("read archived session record: %w", err)
	}
	if _, err := os.Lstat(s.dir); err == nil {
		return nil, api.Errorf(api.KindFailedPrecondition, map[string]any{"workspace_session_id": id}, "a session dir of %s exists already", id)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if filepath.Base(archivedUpper(src, s.rec)) == "upper" && s.rec.Upper != "upper" {
		// An older daemon's archive: its upper dir is "upper".
		s.rec.Upper = "upper"
	}
	rebased := false
	if _, err := d.store.Lease(s.rec.LeaseID); err != nil {
		if l := d.newestLease(s.owner()); l != nil {
			s.rec.LeaseID = l.ID
		} else {
			l, err := d.store.Acquire(s.owner())
			if err != nil {
				return nil, fmt.Errorf("lease: %w", err)
			}
			s.rec.LeaseID, rebased = l.ID, true
		}
	}
	s.rec.RestoredBy = rid
	if err := writeJSONAtomic(filepath.Join(src, "session.json"), s.rec); err != nil {
		return nil, err
	}
	if err := os.Rename(src, s.dir); err != nil {
		return nil, err
	}
	_ = os.Remove(filepath.Join(s.dir, "archived.json"))
	for _, sub := range []string{"work", "merged"} {
		if err := os.MkdirAll(filepath.Join(s.dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	s.act.touch()
	if d.rt != nil { // the in-process tests run without a runtime
		if err := d.restore(ctx, s); err != nil {
			// The session dir stays under sessions/: recover_workspace_session
			// (or the next boot) starts it again, its work intact.
			s.setState(StateFinalizeFailed)
			d.mu.Lock()
			d.sessions[id] = s
			d.mu.Unlock()
			return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": id, "session_state": StateFinalizeFailed,
				"recovery_operation": "recover_workspace_session"}, "restore %s: starting the session failed: %s", id, d.confine(s, err))
		}
	}
	d.mu.Lock()
	d.sessions[id] = s
	d.mu.Unlock()
	d.event(ctx, "workspace_session.restored", map[string]any{"workspace_session_id": id, "files_changed": arch.FilesChanged, "rebased": rebased})
	return d.restoredResult(s, rebased), nil
}

func (d *Daemon) restoredResult(s *session, rebased bool) *api.RestoreSessionResult {
	return &api.RestoreSessionResult{WorkspaceSessionID: s.rec.ID, State: s.seen().state, Agent: s.rec.Agent,
		NetworkProfile: s.rec.NetworkProfile, FilesChanged: countChanges(s.upper()), Rebased: rebased}
}

func writeJSONAtomic(name string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return writeFileAtomic(name, b)
}
