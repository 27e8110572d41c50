package sandboxinit

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/command"
)

// streamingOps are the operations that can stream command output while
// they wait (their yield).
var streamingOps = map[string]bool{"exec_command": true, "write_command_stdin": true}

// streamWriteTimeout bounds each frame of a streamed answer.
const streamWriteTimeout = 30 * time.Second

// wantsStream reports whether the caller asked for a streamed answer.
func wantsStream(op string, r *http.Request) bool {
	return streamingOps[op] && strings.Contains(r.Header.Get("Accept"), api.ContentTypeNDJSON)
}

// serveStreaming runs h with a line sink that writes each output line as a
// frame, then writes the result (or error) frame. The status is 200 once
// the first byte is out; the last frame says how the call ended.
func (s *Server) serveStreaming(w http.ResponseWriter, r *http.Request, h handler, rid string, body []byte) {
	w.Header().Set("Content-Type", api.ContentTypeNDJSON)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	// Each frame must be taken within streamWriteTimeout: a reader that
	// stalls fails the stream instead of holding the command's output. The
	// deadline is lifted at the end, for the next request on the connection.
	rc := http.NewResponseController(w)
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	write := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if enc.Encode(v) == nil {
			_ = rc.Flush()
		}
	}
	ctx := command.WithLineSink(r.Context(), func(l api.OutputLine) { write(map[string]any{"line": l}) })
	res, err := h(ctx, rid, body)
	if err != nil {
		write(api.Envelope{Error: api.AsError(err)})
		return
	}
	write(map[string]any{"result": res})
}
