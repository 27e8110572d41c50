package mcp

import (
	"context"
	"strings"
	"sync"
	"time"

	mcplib "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// maxProgressMessage caps the text of one notification; a flush with more
// pending text sends it in several.
const maxProgressMessage = 16 << 10

// progress turns the gateway's progress messages into
// notifications/progress for the request's progress token. Messages are
// coalesced: the first goes out at once, later ones at most once per
// interval, joined by newlines, so a command printing thousands of lines
// sends a few notifications a second.
type progress struct {
	ctx      context.Context
	srv      *mcpserver.MCPServer
	token    mcplib.ProgressToken
	interval time.Duration

	mu      sync.Mutex
	pending []string
	size    int
	count   int       // messages received (the notification's progress)
	last    time.Time // last send
	timer   *time.Timer
	closed  bool
}

// newProgress returns nil when the client asked for no progress.
func newProgress(ctx context.Context, req mcplib.CallToolRequest, interval time.Duration) *progress {
	if req.Params.Meta == nil || req.Params.Meta.ProgressToken == nil {
		return nil
	}
	srv := mcpserver.ServerFromContext(ctx)
	if srv == nil {
		return nil
	}
	return &progress{ctx: ctx, srv: srv, token: req.Params.Meta.ProgressToken, interval: interval}
}

// sink is the callback for the gateway call (nil when no progress).
func (p *progress) sink() func(string) {
	if p == nil {
		return nil
	}
	return p.add
}

func (p *progress) add(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.count++
	p.pending = append(p.pending, msg)
	p.size += len(msg) + 1
	wait := p.interval - time.Since(p.last)
	switch {
	case wait <= 0 || p.size >= maxProgressMessage:
		p.flushLocked()
	case p.timer == nil:
		p.timer = time.AfterFunc(wait, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.timer = nil
			if !p.closed {
				p.flushLocked()
			}
		})
	}
}

// flushLocked sends what is pending; p.mu is held.
func (p *progress) flushLocked() {
	for len(p.pending) > 0 {
		n, size := 0, 0
		for n < len(p.pending) && (n == 0 || size+len(p.pending[n]) < maxProgressMessage) {
			size += len(p.pending[n]) + 1
			n++
		}
		msg := strings.Join(p.pending[:n], "\n")
		if len(msg) > maxProgressMessage {
			msg = msg[:maxProgressMessage]
		}
		p.pending = p.pending[n:]
		// A client that went away just misses the notification; the
		// call itself still answers.
		_ = p.srv.SendNotificationToClient(p.ctx, string(mcplib.MethodNotificationProgress), map[string]any{
			"progressToken": p.token, "progress": p.count - len(p.pending), "message": msg})
	}
	p.pending, p.size, p.last = nil, 0, time.Now()
}

// close sends what is left; later messages are dropped.
func (p *progress) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.flushLocked()
	p.closed = true
}
