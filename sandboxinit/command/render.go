package command

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// window is a range [from, to) of final line offsets. truncated says that
// lines between the requested start and from are not in it (dropped from
// memory, or skipped because a yield returns only the newest lines).
type window struct {
	from, to  int
	truncated bool
}

// budget is how many bytes of final lines one response may carry: the
// running command's partial tails are shown too and count against it.
// c.mu is held.
func (c *command) budget() int {
	b := c.e.opts.MaxResponseBytes
	if c.status == api.StatusRunning {
		b -= len(c.out.partialText(streamStdout)) + len(c.out.partialText(streamStderr))
	}
	return b
}

// tailWindow is what a yield returns: the lines from offset from on, or only
// the newest ones when there are more than a response holds. c.mu is held.
func (c *command) tailWindow(from int) window {
	ls := &c.out.lines
	total := ls.total()
	w := window{from: min(from, total), to: total}
	if first := ls.firstOffset(); w.from < first {
		w.from, w.truncated = first, true
	}
	if w.to-w.from > yieldLines {
		w.from, w.truncated = w.to-yieldLines, true
	}
	budget := c.budget()
	for i := w.to - 1; i >= w.from; i-- {
		n := ls.lineLen(i)
		if i < w.to-1 && n > budget {
			w.from, w.truncated = i+1, true
			break
		}
		budget -= n
	}
	return w
}

// headWindow is what Read returns: up to limit lines from offset from on,
// fewer when the response would exceed its byte budget. c.mu is held.
func (c *command) headWindow(from, limit int) window {
	ls := &c.out.lines
	total := ls.total()
	w := window{from: min(from, total)}
	if first := ls.firstOffset(); w.from < first {
		w.from, w.truncated = first, true
	}
	w.to = w.from
	budget := c.budget()
	for w.to < total && w.to-w.from < limit {
		n := ls.lineLen(w.to)
		if w.to > w.from && n > budget {
			break
		}
		budget -= n
		w.to++
	}
	return w
}

// render builds the response for window w. While the command runs and w
// reaches the last final line, the unterminated tails follow as tentative
// lines (offsets from total_lines on, not counted in total_lines or
// end_offset). c.mu is held.
func (c *command) render(w window, wall time.Duration) *api.CommandOutput {
	ls := &c.out.lines
	total := ls.total()
	running := c.status == api.StatusRunning
	end := c.ended
	if running {
		end = c.e.opts.Now()
	}
	out := &api.CommandOutput{
		Status:                  c.status,
		WallTimeSeconds:         wall.Seconds(),
		CommandTotalTimeSeconds: end.Sub(c.started).Seconds(),
		StartOffset:             w.from,
		EndOffset:               w.to,
		TotalLines:              total,
		Truncated:               w.truncated,
		WorkspaceSessionID:      c.meta.WorkspaceSessionID,
	}
	if !running {
		code := c.exitCode
		out.ExitCode = &code
	}
	if c.dropped > 0 {
		out.OutputDropped = fmt.Sprintf("the output of this finished command (%d lines) was dropped to keep the sandbox's retained command output "+
			"within its budget of %d bytes; the oldest finished commands lose their output first", total, c.dropped)
	}

	type piece struct {
		off  int
		text []byte
		st   stream
	}
	pieces := make([]piece, 0, w.to-w.from+2)
	size := 0
	for off := w.from; off < w.to; off++ {
		text, st := ls.line(off)
		pieces = append(pieces, piece{off, text, st})
		size += len(text) + 1
	}
	chars := ls.runes
	lines := total
	if running && w.to == total {
		off := total
		for _, st := range []stream{streamStdout, streamStderr} {
			if p := c.out.partialText(st); len(p) > 0 {
				pieces = append(pieces, piece{off, p, st})
				size += len(p) + 1
				chars += int64(utf8.RuneCount(p))
				lines++
				off++
			}
		}
	}
	if lines > 1 {
		chars += int64(lines - 1) // the newlines joining them
	}
	out.OriginalTokenCount = int((chars + 3) / 4)
	if len(pieces) == 0 {
		return out
	}

	var all strings.Builder
	var std [2]strings.Builder
	var count [2]int
	all.Grow(size)
	out.Lines = make([]api.OutputLine, len(pieces))
	for i, p := range pieces {
		s := string(p.text)
		out.Lines[i] = api.OutputLine{Offset: p.off, Stream: p.st.String(), Text: s}
		if i > 0 {
			all.WriteByte('\n')
		}
		all.WriteString(s)
		if count[p.st] > 0 {
			std[p.st].WriteByte('\n')
		}
		std[p.st].WriteString(s)
		count[p.st]++
	}
	out.Output = all.String()
	out.Stdout, out.Stderr = std[streamStdout].String(), std[streamStderr].String()
	return out
}
