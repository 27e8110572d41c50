package command

import (
	"context"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Read pages a command's output by line offset (limit defaults to
// api.DefaultReadLimit, at most api.MaxReadLimit). It does not move the
// yield cursor. A start_offset before the oldest kept line starts at that
// line and says truncated; one past the end gives an empty window at the end.
// A command that just ended is shown terminal only once OnExit returned, so
// the page carries what OnExit attached (an implicit session's publish
// outcome); until then, or when ctx ends first, it is shown running.
func (e *Engine) Read(ctx context.Context, a api.ReadCommandLinesArgs) (*api.CommandOutput, error) {
	callStart := e.opts.Now()
	c, err := e.lookup(a.CommandSessionID)
	if err != nil {
		return nil, err
	}
	if a.StartOffset < 0 {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"start_offset": a.StartOffset}, "start_offset must not be negative")
	}
	limit := a.Limit
	if limit <= 0 {
		limit = api.DefaultReadLimit
	}
	limit = min(limit, api.MaxReadLimit)

	settled := c.settle(ctx)
	c.mu.Lock()
	if settled && c.status != api.StatusRunning && !isClosed(c.finalized) {
		c.mu.Unlock() // it ended just now: wait for OnExit
		return e.Read(ctx, a)
	}
	out := c.render(c.headWindow(a.StartOffset, limit), e.opts.Now().Sub(callStart))
	results := append([]func(*api.CommandOutput){}, c.results...)
	c.mu.Unlock()
	if !settled {
		out.Status, out.ExitCode = api.StatusRunning, nil
	}
	out.CommandSessionID = c.id
	for _, f := range results {
		f(out)
	}
	return out, nil
}
