package gateway

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcplib "github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"
)

// streamingBackend streams three output lines for exec_command.
type streamingBackend struct{ fakeBackend }

func (s *streamingBackend) RuntimeProgress(ctx context.Context, op, id string, args map[string]any, progress func(string)) (any, error) {
	s.record("runtime_progress", op, id, args, ctx)
	// The last line right before the result: it must not be lost (mcp-go
	// drops a notification racing the result unless an event store orders
	// them, see mcp.EventStore).
	for _, l := range []string{"one", "two", "three"} {
		progress(l)
	}
	return json.RawMessage(`{"status":"ok","exit_code":0,"output":"one\ntwo\nthree"}`), nil
}

func mcpClient(t *testing.T, addr, set, token string) (*mcpclient.Client, error) {
	t.Helper()
	cl, err := mcpclient.NewStreamableHttpClient("http://"+addr+"/mcp/"+set,
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	require.NoError(t, err)
	require.NoError(t, cl.Start(t.Context()))
	t.Cleanup(func() { _ = cl.Close() })
	req := mcplib.InitializeRequest{}
	req.Params.ProtocolVersion = mcplib.ProtocolVersion20250618
	_, err = cl.Initialize(t.Context(), req)
	return cl, err
}

// serve runs s on a loopback listener until the test ends.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); l.Close(); <-done })
	return l.Addr().String()
}

func TestMCPOverHTTP(t *testing.T) {
	sb := &streamingBackend{}
	s := New(sb, testToken, nil)
	addr := serve(t, s)

	_, err := mcpClient(t, addr, "runtime", "wrong")
	require.Error(t, err, "the MCP endpoint needs the gateway token")
	require.Equal(t, 0, sb.n())

	resp, err := http.Post("http://"+addr+"/mcp/nope", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "auth comes before routing")

	cl, err := mcpClient(t, addr, "runtime", testToken)
	require.NoError(t, err)
	tools, err := cl.ListTools(t.Context(), mcplib.ListToolsRequest{})
	require.NoError(t, err)
	require.NotEmpty(t, tools.Tools)

	var mu sync.Mutex
	var msgs []string
	cl.OnNotification(func(n mcplib.JSONRPCNotification) {
		if n.Method == string(mcplib.MethodNotificationProgress) {
			mu.Lock()
			msgs = append(msgs, n.Params.AdditionalFields["message"].(string))
			mu.Unlock()
		}
	})
	req := mcplib.CallToolRequest{}
	req.Params.Name = "exec_command"
	req.Params.Arguments = map[string]any{"sandbox_id": "eos-1", "cmd": "echo"}
	req.Params.Meta = &mcplib.Meta{ProgressToken: "p1"}
	res, err := cl.CallTool(t.Context(), req)
	require.NoError(t, err)
	require.False(t, res.IsError)
	c := sb.last()
	require.Equal(t, "runtime_progress", c.kind, "with a progress token the call streams")
	require.Equal(t, "eos-1", c.sandboxID)
	mu.Lock()
	require.Contains(t, strings.Join(msgs, "\n"), "three", "every notification arrives before the result (the event store orders them)")
	mu.Unlock()

	// Without a token the same tool is a plain call; a failure is a tool
	// result.
	req.Params.Meta = nil
	req.Params.Name = "file_read"
	req.Params.Arguments = map[string]any{"sandbox_id": "eos-1", "path": "x"}
	res, err = cl.CallTool(t.Context(), req)
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Equal(t, "runtime", sb.last().kind)
}
