package sandboxinit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
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
	} else if s, err = d.session(a.WorkspaceSessionID); err != nil {
		return nil, err
	}

	// Admission: no command starts while the session is being published,
	// refreshed or destroyed.
	s.gate.Lock()
	if s.state != StateActive || s.rt == nil {
		s.gate.Unlock()
		return nil, api.Errorf(api.KindOperationFailed, map[string]any{"workspace_session_id": s.rec.ID, "finalization_state": s.state},
			"workspace session %s is %s", s.rec.ID, s.state)
	}
	rs := s.rt
	starter := func(ctx context.Context, spec command.Spec) (command.Process, error) {
		p, err := rs.Exec(ctx, runtime.ProcSpec{Args: spec.Args, Env: append([]string{"GIT_OPTIONAL_LOCKS=0"}, spec.Env...), Cwd: cwd,
			Stdin: spec.Stdin, Stdout: spec.Stdout, Stderr: spec.Stderr, TTY: spec.TTY, Rows: spec.Rows, Cols: spec.Cols, ViaInit: !spec.TTY})
		if err != nil {
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
	meta := command.Meta{WorkspaceSessionID: s.rec.ID, OnExit: exited}
	var done chan func(*api.CommandOutput)
	if implicit {
		done = make(chan func(*api.CommandOutput), 1)
		bg := context.WithoutCancel(ctx) // the publish outlives this request, in its trace
		meta.OnExit = func(id string, out *api.CommandOutput) { exited(id, out); go d.finishImplicit(bg, s, id, done) }
	}
	d.obs.Running.Add(x)
	out, err := d.cmds.Start(ctx, starter, a, meta)
	s.gate.Unlock()
	if err != nil {
		d.obs.Running.Remove(x)
		if implicit {
			_, _ = d.teardown(context.WithoutCancel(ctx), s, true)
		}
		return nil, err
	}
	started = true
	d.obs.Running.SetID(x, out.CommandSessionID)
	if implicit && out.Status != api.StatusRunning {
		// The command ended within the yield: wait for its publish so the
		// terminal response carries the outcome.
		select {
		case apply := <-done:
			apply(out)
		case <-ctx.Done():
		}
	}
	return out, nil
}

// finishImplicit publishes an implicit session once its command ended, then
// destroys it; the outcome rides on the command's terminal response.
func (d *Daemon) finishImplicit(ctx context.Context, s *session, cmdID string, done chan<- func(*api.CommandOutput)) {
	s.gate.Lock()
	defer s.gate.Unlock()
	if len(d.cmds.Active(s.rec.ID)) > 0 {
		return
	}
	res, err := d.publishLocked(ctx, s, api.PublishArgs{TxID: "implicit:" + s.rec.ID})
	if err != nil {
		// A rejected implicit publish discards the changes (the seed's
		// policy) but, unlike the seed, says exactly what conflicted.
		_, _ = d.teardown(ctx, s, true)
	}
	apply := func(out *api.CommandOutput) {
		if err == nil {
			f := false
			out.PublishRejected, out.Publish = &f, res
			return
		}
		t := true
		out.PublishRejected = &t
		out.PublishRejectClass = "publish_failed"
		var ae *api.Error
		if errors.As(err, &ae) {
			if rej, ok := ae.Details["publish_rejection"].(map[string]any); ok {
				out.PublishRejectClass = fmt.Sprint(rej["reason"])
			}
			if cs, ok := ae.Details["conflicts"].([]map[string]any); ok {
				out.PublishConflicts = cs
			}
		}
	}
	d.cmds.SetResult(cmdID, apply)
	done <- apply
}

var _ = layerstack.ReasonSourceConflict

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
