package sandboxinit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/command"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/observe"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// exec runs a command in a session; without a session id it creates an
// implicit session that publishes and goes away when its command ends.
func (d *Daemon) exec(ctx context.Context, a api.ExecCommandArgs) (_ *api.CommandOutput, retErr error) {
	if a.Cmd == "" {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "cmd is required")
	}
	if strings.ContainsRune(a.Cmd, 0) { // no argv can carry it: the start would fail as the daemon's own error
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "cmd"}, "cmd contains a NUL byte")
	}
	if err := command.CheckEnv(a.Env); err != nil { // before an implicit session is made for it
		return nil, err
	}
	if err := checkCommandSize(a); err != nil {
		return nil, err
	}
	// command.exec lasts until the command ends (OnExit), not just this
	// request; it ends here only if the command never started.
	ctx, sp := d.span(ctx, "command.exec", map[string]any{"cmd": observe.CapCommand(a.Cmd), "workspace_session_id": a.WorkspaceSessionID, "tty": a.TTY})
	started := false
	defer func() {
		if !started {
			sp.End(retErr)
		}
	}()
	cwd := WorkspaceRoot
	if a.Cwd != "" {
		rel, err := workspacePath(a.Cwd)
		if err != nil {
			return nil, err
		}
		if rel != "" {
			cwd += "/" + rel
		}
	}
	implicit := a.WorkspaceSessionID == ""
	var s *session
	var err error
	if implicit {
		if s, err = d.createSession(ctx, api.CreateSessionArgs{}, true); err != nil {
			return nil, err
		}
	}

	// Admission: no command starts while the session is being published,
	// refreshed or destroyed. The gate is held until the command is Active
	// (meta.Started), not through the yield: an implicit session's OnExit
	// takes it to publish.
	if implicit {
		s.gate.Lock()
	} else if s, err = d.lockLive(a.WorkspaceSessionID); err != nil {
		return nil, err
	}
	var unlockOnce sync.Once
	unlock := func() { unlockOnce.Do(s.gate.Unlock) }
	defer unlock()
	if s.state != StateActive || s.rt == nil {
		det := map[string]any{"workspace_session_id": s.rec.ID, "finalization_state": s.state}
		if s.state == StatePublishing || s.state == StateFinalizeFailed {
			det["recovery_operation"] = "recover_workspace_session"
		}
		return nil, api.Errorf(api.KindOperationFailed, det, "workspace session %s is %s", s.rec.ID, s.state)
	}
	rs := s.rt
	noShell := func(program string) error {
		return api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "program": program},
			"workspace session %s has no %s, which runs every command (%s -c CMD): the sandbox's image has no shell; use an image with one",
			s.rec.ID, program, program)
	}
	starter := func(ctx context.Context, spec command.Spec) (command.Process, error) {
		// A TTY command's helper starts whatever the program: look first.
		// Other commands fail to start without it, and are looked at then.
		if spec.TTY && len(spec.Args) > 0 && missingInSession(rs, spec.Args[0]) {
			return nil, noShell(spec.Args[0])
		}
		p, err := rs.Exec(ctx, runtime.ProcSpec{Args: spec.Args, Env: append([]string{"GIT_OPTIONAL_LOCKS=0"}, spec.Env...), Cwd: cwd,
			Stdin: spec.Stdin, Stdout: spec.Stdout, Stderr: spec.Stderr, TTY: spec.TTY, Rows: spec.Rows, Cols: spec.Cols, ViaInit: !spec.TTY})
		if err != nil {
			if len(spec.Args) > 0 && missingInSession(rs, spec.Args[0]) {
				return nil, noShell(spec.Args[0])
			}
			return nil, err
		}
		return p, nil
	}
	s.act.touch()
	sp.Set("workspace_session_id", s.rec.ID)
	x := &observe.Execution{Workspace: s.rec.ID, Cmd: observe.CapCommand(a.Cmd), Trace: telemetry.TraceID(ctx), Started: time.Now().UTC()}
	exited := func(id string, out *api.CommandOutput) {
		s.act.touch()
		d.obs.Running.Remove(x)
		d.touch() // the end of a command is activity: sample what it left
		sp.Set("command_session_id", id)
		if out.ExitCode != nil {
			sp.Set("exit_code", *out.ExitCode)
		}
		sp.EndStatus(commandStatus(out.Status), nil)
	}
	meta := command.Meta{WorkspaceSessionID: s.rec.ID, OnExit: exited, Started: unlock}
	if implicit {
		// The publish runs inside OnExit: no response shows the command
		// ended before its outcome is attached (command.Meta.OnExit).
		bg := context.WithoutCancel(ctx) // the publish outlives this request, in its trace
		meta.OnExit = func(id string, out *api.CommandOutput) {
			exited(id, out)
			d.finishImplicit(bg, s, id)
		}
	}
	d.obs.Running.Add(x)
	out, err := d.cmds.Start(ctx, starter, a, meta)
	unlock()
	if err != nil {
		d.obs.Running.Remove(x)
		if implicit {
			_, _ = d.teardown(context.WithoutCancel(ctx), s, true)
		}
		if errors.Is(err, runtime.ErrInvalidSpec) || errors.Is(err, unix.E2BIG) {
			// What checkCommandSize cannot see: the request as the session
			// init gets it (JSON-escaped, with the session's own env).
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "cmd"}, "the command cannot be started as given: %v", err)
		}
		return nil, err
	}
	started = true
	d.obs.Running.SetID(x, out.CommandSessionID)
	return out, nil
}

// checkCommandSize refuses a cmd, or an env, over api.MaxCommandBytes
// (invalid_request, details.arg, size, max), before anything is made for it.
func checkCommandSize(a api.ExecCommandArgs) error {
	envBytes := 0
	for k, v := range a.Env {
		envBytes += len(k) + len(v) + 2
	}
	for _, c := range []struct {
		arg string
		n   int
	}{{"cmd", len(a.Cmd)}, {"env", envBytes}} {
		if c.n > api.MaxCommandBytes {
			return api.Errorf(api.KindInvalidRequest, map[string]any{"arg": c.arg, "size": c.n, "max": api.MaxCommandBytes},
				"%s has %d bytes, more than %d: a command takes at most that much %s (write a script into the workspace and run it)", c.arg, c.n, api.MaxCommandBytes, c.arg)
		}
	}
	return nil
}

// finishImplicit publishes an implicit session once its command ended, then
// destroys it, and attaches the outcome to the command's responses. It runs
// in the command's OnExit, so every terminal response carries the outcome;
// the session stays listed, "finalizing", until it is gone.
func (d *Daemon) finishImplicit(ctx context.Context, s *session, cmdID string) {
	s.gate.Lock()
	defer s.gate.Unlock()
	if len(d.cmds.Active(s.rec.ID)) > 0 {
		return
	}
	if !d.live(s) {
		// Destroyed while its command ran (a forced destroy, the reaper):
		// nothing was published.
		d.cmds.SetResult(cmdID, implicitOutcome(nil, errSessionNotFound(s.rec.ID)))
		return
	}
	s.setState(StateFinalizing)
	res, err := d.publishLocked(ctx, s, api.PublishArgs{TxID: s.ownTxID()})
	if err != nil {
		res, err = d.closeImplicit(ctx, s, err)
	}
	d.cmds.SetResult(cmdID, implicitOutcome(res, err))
}

// closeImplicit ends implicit session s after its publish failed with err.
// A rejected implicit publish discards the changes (the seed's policy)
// but, unlike the seed, says exactly what conflicted. One that failed
// after its commit point (closing the session, finishing its record) did
// publish the command's changes: that is the command's outcome, not a
// failed publish its agent would run the command again for. If the close
// fails again, such a session stays listed finalize_failed for
// recover_workspace_session and the boot, which finish it from the
// commit's record.
func (d *Daemon) closeImplicit(ctx context.Context, s *session, err error) (map[string]any, error) {
	var ae *api.Error
	committed := errors.As(err, &ae) && (ae.Details["committed"] == true || ae.Details["publish_completed"] == true)
	var pub *api.PublishSummary
	if committed {
		// Its own commit: the txid's record names this session's lease
		// (a client may have used the txid for another session's publish,
		// which the store refused this one for).
		if rec, rerr := d.store.TxRecord(s.ownTxID()); rerr == nil && rec.Owner == s.owner() && rec.FromLease == s.rec.LeaseID {
			pub = publishJSON(rec)
		} else if p, ok := ae.Details["publish"].(*api.PublishSummary); ok && ae.Details["publish_completed"] == true {
			pub = p // the close failed after the commit answered
		} else {
			committed = false
		}
	}
	if !committed {
		_, _ = d.teardown(ctx, s, true)
		return nil, err
	}
	_, terr := d.closeSession(ctx, s, leaseReleased)
	return map[string]any{"workspace_session_id": s.rec.ID, "publish": pub, "destroyed": terr == nil}, nil
}

// implicitOutcome is what an implicit session's publish adds to its
// command's responses: the publish, or publish_rejected with the class and
// the conflicts. A clean publish adds no publish_rejected key (the seed's
// contract).
func implicitOutcome(res map[string]any, err error) func(*api.CommandOutput) {
	if err == nil {
		return func(out *api.CommandOutput) { out.Publish = res }
	}
	class := "publish_failed"
	var conflicts []api.Conflict
	var rej *publishRejected
	var ae *api.Error
	switch {
	case errors.As(err, &rej):
		class = rej.conflict.Reason()
		conflicts = rejection(rej.conflict).Conflicts
	case errors.As(err, &ae) && ae.Kind == api.KindNotFound:
		class = "session_destroyed"
	}
	return func(out *api.CommandOutput) {
		t := true
		out.PublishRejected, out.PublishRejectClass, out.PublishConflicts = &t, class, conflicts
	}
}

// commandStatus maps a terminal command status to a span status.
func commandStatus(st string) string {
	switch st {
	case api.StatusOK:
		return telemetry.StatusCompleted
	case api.StatusTimedOut:
		return telemetry.StatusTimedOut
	case api.StatusCancelled:
		return telemetry.StatusCancelled
	}
	return telemetry.StatusError
}
