package command

import (
	"context"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// streamPoll is how often a streaming yield looks for new lines. Reading
// them is an in-memory copy under the command's lock, so this costs
// nothing measurable and only runs while a caller waits.
const streamPoll = 50 * time.Millisecond

type lineSinkKey struct{}

// WithLineSink returns a context whose exec_command / write_command_stdin
// yields deliver each final output line to sink as it appears, before the
// response (which is unchanged). sink is called from one goroutine at a
// time.
func WithLineSink(ctx context.Context, sink func(api.OutputLine)) context.Context {
	return context.WithValue(ctx, lineSinkKey{}, sink)
}

func lineSink(ctx context.Context) func(api.OutputLine) {
	f, _ := ctx.Value(lineSinkKey{}).(func(api.OutputLine))
	return f
}

// waitStreaming waits like yield's plain wait (up to d, or until c exits,
// or ctx ends) and meanwhile delivers the lines that became final since the
// yield's cursor — the lines its response will hold.
func (c *command) waitStreaming(ctx context.Context, d time.Duration, sink func(api.OutputLine)) {
	c.mu.Lock()
	off := c.cursor
	c.mu.Unlock()
	// deliver sends what became final since the last call — once the
	// command has exited, everything that is left — and stops at the
	// yield's deadline: a command printing faster than the caller reads
	// cannot hold the yield past it (what was not streamed is in the
	// response, or paged with read_command_lines).
	until := time.Now().Add(d)
	deliver := func(exited bool) {
		for {
			c.mu.Lock()
			w := c.headWindow(off, api.MaxReadLimit)
			lines := make([]api.OutputLine, 0, w.to-w.from)
			for o := w.from; o < w.to; o++ {
				text, st := c.out.lines.line(o)
				lines = append(lines, api.OutputLine{Offset: o, Stream: st.String(), Text: string(text)})
			}
			c.mu.Unlock()
			for _, l := range lines {
				if ctx.Err() != nil || time.Now().After(until) {
					return
				}
				sink(l)
				off = l.Offset + 1
			}
			if len(lines) == 0 || !exited {
				return
			}
		}
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(streamPoll)
	defer tick.Stop()
	for {
		select {
		case <-c.exited:
			// The terminal state is recorded once the output is drained,
			// so the last lines are final now.
			deliver(true)
			return
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
			deliver(false)
		}
	}
}
