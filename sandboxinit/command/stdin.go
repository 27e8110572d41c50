package command

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// WriteStdin writes to a running command's stdin, then yields like Start.
// Empty stdin only yields (also on a finished command: its terminal
// response). Without a TTY, a \x03 or \x04 anywhere cancels the command
// instead (the seed's rule); with a TTY every byte goes to the terminal as
// is, so ^C reaches the line discipline and becomes SIGINT.
//
// A write that does not complete within StdinDeadline (the process is not
// reading) fails with operation_failed and details.reason
// "stdin_backpressure"; details.bytes_written says how much went through.
func (e *Engine) WriteStdin(ctx context.Context, a api.WriteCommandStdinArgs) (*api.CommandOutput, error) {
	callStart := e.opts.Now()
	c, err := e.lookup(a.CommandSessionID)
	if err != nil {
		return nil, err
	}
	if len(a.Stdin) > api.MaxStdinBytes {
		return nil, api.Errorf(api.KindRequestTooLarge, map[string]any{"max_stdin_bytes": api.MaxStdinBytes},
			"stdin is %d bytes, more than %d", len(a.Stdin), api.MaxStdinBytes)
	}
	yield := clampMS(a.YieldTimeMS, api.DefaultYieldTimeMS, 0, api.MaxYieldTimeMS)
	if a.Stdin == "" {
		return e.yield(ctx, c, yield, callStart), nil
	}
	if !c.running() {
		return nil, notRunning(c.id)
	}
	if !c.tty && strings.ContainsAny(a.Stdin, "\x03\x04") {
		return e.cancel(ctx, c, callStart), nil
	}
	if err := c.writeStdin(a.Stdin); err != nil {
		return nil, err
	}
	return e.yield(ctx, c, yield, callStart), nil
}

// CloseStdin closes a running command's stdin so it reads end-of-file. With
// a TTY the terminal stays open: write "\x04" at the start of a line instead.
func (e *Engine) CloseStdin(id string) error {
	c, err := e.lookup(id)
	if err != nil {
		return err
	}
	if !c.running() {
		return notRunning(c.id)
	}
	c.closeStdin()
	return nil
}

func (c *command) writeStdin(s string) error {
	c.stdinMu.Lock()
	defer c.stdinMu.Unlock()
	details := map[string]any{"command_session_id": c.id}
	if err := c.stdin.SetWriteDeadline(time.Now().Add(c.e.opts.StdinDeadline)); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return c.stdinClosed()
		}
		return api.Errorf(api.KindInternal, details, "stdin: %v", err)
	}
	n, err := c.stdin.WriteString(s)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		details["reason"] = "stdin_backpressure"
		details["bytes_written"] = n
		return api.Errorf(api.KindOperationFailed, details,
			"stdin write timed out after %s with %d of %d bytes written: the command is not reading its input", c.e.opts.StdinDeadline, n, len(s))
	case errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EPIPE):
		return c.stdinClosed()
	default:
		return api.Errorf(api.KindOperationFailed, details, "stdin: %v", err)
	}
}

func (c *command) stdinClosed() error {
	if !c.running() {
		return notRunning(c.id)
	}
	return api.Errorf(api.KindOperationFailed, map[string]any{"command_session_id": c.id, "reason": "stdin_closed"}, "stdin is closed")
}
