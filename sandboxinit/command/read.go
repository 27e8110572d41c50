package command

import (
	"github.com/ephemeral-sandbox/sandbox/api"
)

// Read pages a command's output by line offset (limit defaults to
// api.DefaultReadLimit, at most api.MaxReadLimit). It does not move the
// yield cursor. A start_offset before the oldest kept line starts at that
// line and says truncated; one past the end gives an empty window at the end.
func (e *Engine) Read(a api.ReadCommandLinesArgs) (*api.CommandOutput, error) {
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

	c.mu.Lock()
	out := c.render(c.headWindow(a.StartOffset, limit), e.opts.Now().Sub(callStart))
	results := append([]func(*api.CommandOutput){}, c.results...)
	c.mu.Unlock()
	out.CommandSessionID = c.id
	for _, f := range results {
		f(out)
	}
	return out, nil
}
