package command

import (
	"context"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// yield waits up to d for c to end, then responds.
func (e *Engine) yield(ctx context.Context, c *command, d time.Duration, callStart time.Time) *api.CommandOutput {
	if sink := lineSink(ctx); sink != nil && d > 0 {
		c.waitStreaming(ctx, d, sink)
	} else if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-c.exited:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return e.respond(ctx, c, callStart)
}

// respond renders a yield's response: while running, the lines since the
// cursor, which then moves past them; once terminal, the lines since the
// cursor without moving it, so every terminal response is the same. A
// terminal response waits for OnExit so that what it attached with SetResult
// is in it; if ctx ends first, the command is shown still running.
func (e *Engine) respond(ctx context.Context, c *command, callStart time.Time) *api.CommandOutput {
	settled := c.settle(ctx)
	c.mu.Lock()
	if settled && c.status != api.StatusRunning && !isClosed(c.finalized) {
		c.mu.Unlock() // it ended just now: wait for OnExit
		return e.respond(ctx, c, callStart)
	}
	w := c.tailWindow(c.cursor)
	out := c.render(w, e.opts.Now().Sub(callStart))
	if c.status == api.StatusRunning {
		c.cursor = w.to
	}
	// Always present (the seed's frozen key set lists it): a finished
	// command stays readable with read_command_lines while retained.
	out.CommandSessionID = c.id
	results := append([]func(*api.CommandOutput){}, c.results...)
	c.mu.Unlock()
	if !settled {
		out.Status, out.ExitCode = api.StatusRunning, nil
	}
	for _, f := range results {
		f(out)
	}
	return out
}
