package command

import (
	"context"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// cancelSlack bounds how long Cancel waits beyond KillGrace and DrainGrace
// for the process to be gone (a process in uninterruptible sleep ignores
// even SIGKILL for a while).
const cancelSlack = 5 * time.Second

// Cancel ends a command: SIGTERM to its process group, SIGKILL after
// KillGrace. It waits for the terminal state and returns the terminal
// response (status cancelled, exit code 130, even when the process exited
// cleanly on SIGTERM). Cancelling a finished command returns its terminal
// response unchanged.
func (e *Engine) Cancel(ctx context.Context, a api.CancelCommandArgs) (*api.CommandOutput, error) {
	callStart := e.opts.Now()
	c, err := e.lookup(a.CommandSessionID)
	if err != nil {
		return nil, err
	}
	return e.cancel(ctx, c, callStart), nil
}

func (e *Engine) cancel(ctx context.Context, c *command, callStart time.Time) *api.CommandOutput {
	c.terminate(api.StatusCancelled, e.opts.KillGrace)
	t := time.NewTimer(e.opts.KillGrace + e.opts.DrainGrace + cancelSlack)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
	case <-ctx.Done():
	}
	return e.respond(ctx, c, callStart)
}

// Resize sets a running TTY command's window size.
func (e *Engine) Resize(a api.ResizeCommandArgs) error {
	c, err := e.lookup(a.CommandSessionID)
	if err != nil {
		return err
	}
	if !c.tty {
		return api.Errorf(api.KindInvalidRequest, map[string]any{"command_session_id": c.id}, "command %s has no terminal", c.id)
	}
	if a.Rows == 0 || a.Cols == 0 {
		return api.Errorf(api.KindInvalidRequest, map[string]any{"rows": a.Rows, "cols": a.Cols}, "rows and cols must be positive")
	}
	if !c.running() {
		return notRunning(c.id)
	}
	if err := c.proc.Resize(a.Rows, a.Cols); err != nil {
		return api.Errorf(api.KindOperationFailed, map[string]any{"command_session_id": c.id}, "resize: %v", err)
	}
	return nil
}
