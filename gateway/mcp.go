package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/mcp"
)

// localCaller runs MCP tool calls through this gateway's own dispatch, so
// the HTTP MCP endpoint validates, routes and logs exactly like every
// other door.
type localCaller struct{ s *Server }

func (l localCaller) CallProgress(ctx context.Context, op string, scope jsonl.Scope, args map[string]any, requestID string, progress func(string)) (json.RawMessage, error) {
	raw, aerr := l.s.DispatchProgress(ctx, &jsonl.Request{Op: op, RequestID: requestID, Scope: scope, Args: args}, progress)
	if aerr != nil {
		return nil, aerr
	}
	return raw, nil
}

// mcpHandlers builds the streamable HTTP MCP endpoint of each tool set.
func (s *Server) mcpHandlers() map[string]http.Handler {
	out := map[string]http.Handler{}
	for _, set := range mcp.Sets() {
		srv, err := mcp.NewServer(set, localCaller{s}, mcp.Options{Log: s.Log.With("component", "mcp", "set", set)})
		if err != nil {
			panic(err) // the sets are constants
		}
		out[set] = mcpserver.NewStreamableHTTPServer(srv,
			mcpserver.WithEndpointPath("/mcp/"+set),
			mcpserver.WithHeartbeatInterval(15*time.Second),
			mcpserver.WithEventStore(mcp.NewEventStore()),
			// Sessions a client never ends (no DELETE) are forgotten.
			mcpserver.WithSessionIdleTTL(30*time.Minute),
			mcpserver.WithStreamableHTTPLogger(s.Log.With("component", "mcp_http", "set", set)))
	}
	return out
}

// serveMCP serves /mcp/<set>: the same bearer token as the rest of the API,
// the same body cap.
func (s *Server) serveMCP(handlers map[string]http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		h, ok := handlers[c.Param("set")]
		if !ok {
			abort(c, api.Errorf(api.KindNotFound, map[string]any{"sets": mcp.Sets()}, "no MCP tool set %q (management, runtime, observability)", c.Param("set")))
			return
		}
		if c.Request.ContentLength > int64(s.MaxBody) {
			abort(c, errTooLarge(s.MaxBody))
			return
		}
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, int64(s.MaxBody))
		h.ServeHTTP(c.Writer, c.Request)
	}
}
