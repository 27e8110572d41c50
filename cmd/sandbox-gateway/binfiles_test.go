package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcplib "github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// rawFiles sends one request to the raw-bytes route /v1/sandboxes/<id>/files.
func rawFiles(t *testing.T, g *gatewayProc, method, id string, q url.Values, body []byte) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+g.Addr+"/v1/sandboxes/"+id+"/files?"+q.Encode(), rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := testenv.HTTPClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, b
}

func errOf(t *testing.T, b []byte) *api.Error {
	t.Helper()
	var env api.Envelope
	require.NoError(t, json.Unmarshal(b, &env), "%s", b)
	require.NotNil(t, env.Error, "%s", b)
	return env.Error
}

// binary returns n random bytes that are surely not text: NULs and an
// invalid UTF-8 sequence up front.
func binary(t *testing.T, n int) []byte {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	copy(b, []byte{0, 0xff, 0xfe, 0, 0xc3, 0x28, 0})
	return b
}

// TestBinaryFilesEveryDoor: file_upload / file_download against the real
// stack (gateway process, embedded Temporal, Docker, daemon). A random
// 5 MiB binary round-trips byte-exact over the raw HTTP route and the CLI
// (--from / --to); a binary crosses MCP and JSON lines as content_base64;
// a sessionless upload publishes; too large uploads and path escapes are
// refused with nothing written.
func TestBinaryFilesEveryDoor(t *testing.T) {
	g := startGatewayProcess(t)
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "README"), "base\n")
	rec := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", root)
	id := rec["id"].(string)
	cleanupSandbox(t, id)
	rtc := func(argv ...string) cliResult {
		t.Helper()
		return runCLI(t, g, rt, append([]string{"--sandbox-id", id}, argv...)...)
	}
	ws := mustCLI(t, g, rt, "--sandbox-id", id, "create_workspace_session")["workspace_session_id"].(string)

	t.Run("5 MiB over raw HTTP", func(t *testing.T) {
		data := binary(t, 5<<20)
		start := time.Now()
		st, _, b := rawFiles(t, g, http.MethodPut, id, url.Values{"path": {"out/blob.bin"}, "workspace_session_id": {ws}}, data)
		t.Logf("PUT 5 MiB: %s", time.Since(start)) // a measurement, not an assertion
		require.Equal(t, http.StatusOK, st, "%s", b)
		var up api.FileUploadResult
		require.NoError(t, json.Unmarshal(b, &up))
		sum := sha256.Sum256(data)
		require.Equal(t, api.FileUploadResult{Type: "create", Path: "out/blob.bin", BytesWritten: len(data), SHA256: hex.EncodeToString(sum[:])}, up)
		start = time.Now()
		st, h, got := rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"out/blob.bin"}, "workspace_session_id": {ws}}, nil)
		t.Logf("GET 5 MiB: %s", time.Since(start))
		require.Equal(t, http.StatusOK, st)
		require.Equal(t, "application/octet-stream", h.Get("Content-Type"))
		require.Equal(t, hex.EncodeToString(sum[:]), h.Get("X-Content-Sha256"))
		require.True(t, bytes.Equal(data, got), "downloaded bytes differ (%d vs %d)", len(got), len(data))
		// The session sees the same bytes as a file (not only the daemon's view).
		r := rtc("exec_command", "--workspace-session-id", ws, "sha256sum out/blob.bin")
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.out["output"], hex.EncodeToString(sum[:]))
		// file_read (text) still refuses it.
		r = rtc("file_read", "--workspace-session-id", ws, "--path", "out/blob.bin")
		require.Equal(t, 1, r.code)
	})

	t.Run("5 MiB through the CLI", func(t *testing.T) {
		dir := t.TempDir()
		data := binary(t, 5<<20)
		src, dst := filepath.Join(dir, "in.bin"), filepath.Join(dir, "out.bin")
		require.NoError(t, os.WriteFile(src, data, 0o600))
		r := rtc("file_upload", "--workspace-session-id", ws, "--path", "cli.bin", "--from", src)
		require.Equal(t, 0, r.code, r.stderr)
		require.EqualValues(t, len(data), r.out["bytes_written"])
		r = rtc("file_download", "--workspace-session-id", ws, "--path", "cli.bin", "--to", dst)
		require.Equal(t, 0, r.code, r.stderr)
		require.NotContains(t, r.out, "content_base64")
		require.Equal(t, dst, r.out["local_path"])
		got, err := os.ReadFile(dst)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got))
		// An existing --to is kept unless --force.
		require.NoError(t, os.WriteFile(dst, []byte("mine"), 0o600))
		r = rtc("file_download", "--workspace-session-id", ws, "--path", "cli.bin", "--to", dst)
		require.Equal(t, 2, r.code, r.stdout)
		require.Contains(t, r.errEnv["message"], "--force")
		got, _ = os.ReadFile(dst)
		require.Equal(t, "mine", string(got))
		r = rtc("file_download", "--workspace-session-id", ws, "--path", "cli.bin", "--to", dst, "--force")
		require.Equal(t, 0, r.code, r.stderr)
		got, _ = os.ReadFile(dst)
		require.True(t, bytes.Equal(data, got))
	})

	t.Run("base64 over MCP and JSON lines", func(t *testing.T) {
		cl, err := mcpclient.NewStreamableHttpClient("http://"+g.Addr+"/mcp/runtime",
			transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + g.Token}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		require.NoError(t, cl.Start(t.Context()))
		init := mcplib.InitializeRequest{}
		init.Params.ClientInfo = mcplib.Implementation{Name: "binfiles", Version: "1"}
		init.Params.ProtocolVersion = mcplib.ProtocolVersion20250618
		_, err = cl.Initialize(t.Context(), init)
		require.NoError(t, err)
		call := func(name string, args map[string]any) *mcplib.CallToolResult {
			req := mcplib.CallToolRequest{}
			req.Params.Name, req.Params.Arguments = name, args
			res, err := cl.CallTool(t.Context(), req)
			require.NoError(t, err)
			return res
		}
		data := binary(t, 64<<10)
		res := call("file_upload", map[string]any{"sandbox_id": id, "workspace_session_id": ws, "path": "mcp.bin",
			"content_base64": base64.StdEncoding.EncodeToString(data), "executable": true})
		require.False(t, res.IsError, "%+v", res.StructuredContent)
		res = call("file_download", map[string]any{"sandbox_id": id, "workspace_session_id": ws, "path": "mcp.bin"})
		require.False(t, res.IsError, "%+v", res.StructuredContent)
		sc := res.StructuredContent.(map[string]any)
		got, err := base64.StdEncoding.DecodeString(sc["content_base64"].(string))
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got))
		require.Equal(t, true, sc["executable"])
		// Not base64: refused by the catalog's schema, nothing written.
		res = call("file_upload", map[string]any{"sandbox_id": id, "workspace_session_id": ws, "path": "bad.bin", "content_base64": "not base64!"})
		require.True(t, res.IsError)

		line, err := testenv.RawLine(g.Addr, map[string]any{"op": "file_download", "scope": map[string]any{"kind": "sandbox", "sandbox_id": id},
			"args": map[string]any{"workspace_session_id": ws, "path": "mcp.bin"}, "_sandbox_gateway_auth_token": g.Token})
		require.NoError(t, err)
		var jl api.FileDownloadResult
		require.NoError(t, json.Unmarshal(line, &jl), "%s", line)
		require.True(t, bytes.Equal(data, jl.Content))
		st, _, b := rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"bad.bin"}, "workspace_session_id": {ws}}, nil)
		require.Equal(t, http.StatusNotFound, st, "%s", b)
	})

	t.Run("sessionless upload publishes", func(t *testing.T) {
		data := binary(t, 200<<10)
		st, _, b := rawFiles(t, g, http.MethodPut, id, url.Values{"path": {"assets/logo.png"}}, data)
		require.Equal(t, http.StatusOK, st, "%s", b)
		st, _, got := rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"assets/logo.png"}}, nil)
		require.Equal(t, http.StatusOK, st, "%s", got)
		require.True(t, bytes.Equal(data, got))
		hist := mustCLI(t, g, "sandbox-observability-cli", "--sandbox-id", id, "publish_history", "--limit", "1")
		require.Contains(t, mustJSON(hist), "assets/logo.png")
	})

	t.Run("too large is refused and writes nothing", func(t *testing.T) {
		// Exactly the cap goes through, both ways.
		data := binary(t, api.MaxTransferBytes)
		st, _, b := rawFiles(t, g, http.MethodPut, id, url.Values{"path": {"cap.bin"}, "workspace_session_id": {ws}}, data)
		require.Equal(t, http.StatusOK, st, "%s", b)
		st, _, got := rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"cap.bin"}, "workspace_session_id": {ws}}, nil)
		require.Equal(t, http.StatusOK, st)
		require.True(t, bytes.Equal(data, got))
		// A file made bigger inside the session is refused on the way out.
		r := rtc("exec_command", "--workspace-session-id", ws, "head -c 1 /dev/zero >> cap.bin")
		require.Equal(t, 0, r.code, r.stderr)
		st, _, b = rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"cap.bin"}, "workspace_session_id": {ws}}, nil)
		require.Equal(t, http.StatusTooManyRequests, st, "%s", b)
		require.Equal(t, "max_transfer_bytes", errOf(t, b).Details["limit"])

		st, _, b = rawFiles(t, g, http.MethodPut, id, url.Values{"path": {"big.bin"}, "workspace_session_id": {ws}}, binary(t, api.MaxTransferBytes+1))
		require.Equal(t, http.StatusTooManyRequests, st, "%s", b)
		e := errOf(t, b)
		require.Equal(t, api.KindResourceExhausted, e.Kind)
		require.EqualValues(t, api.MaxTransferBytes, e.Details["max"])
		st, _, b = rawFiles(t, g, http.MethodPut, id, url.Values{"path": {"big.bin"}}, binary(t, api.MaxSessionlessUploadBytes+1))
		require.Equal(t, http.StatusTooManyRequests, st, "%s", b)
		require.Equal(t, "max_sessionless_upload_bytes", errOf(t, b).Details["limit"])
		// The same cap on the JSON door (base64 in the body).
		st, b, err := g.HTTPOp("file_upload", map[string]any{"scope": map[string]any{"kind": "sandbox", "sandbox_id": id},
			"args": map[string]any{"path": "big.bin", "content_base64": base64.StdEncoding.EncodeToString(binary(t, api.MaxSessionlessUploadBytes+1))}})
		require.NoError(t, err)
		require.Equal(t, http.StatusTooManyRequests, st, "%s", b)
		for _, q := range []url.Values{{"path": {"big.bin"}, "workspace_session_id": {ws}}, {"path": {"big.bin"}}} {
			st, _, b := rawFiles(t, g, http.MethodGet, id, q, nil)
			require.Equal(t, http.StatusNotFound, st, "%s", b)
		}
	})

	t.Run("a durable update too large for the workflow is refused and holds nothing up", func(t *testing.T) {
		scope := map[string]any{"kind": "sandbox", "sandbox_id": id}
		big := strings.Repeat("x", api.MaxUpdateArgsBytes)
		for _, c := range []struct {
			op   string
			args map[string]any
		}{
			{"file_write", map[string]any{"path": "big.txt", "content": big}},
			{"file_edit", map[string]any{"path": "assets/logo.png", "edits": []any{map[string]any{"old_string": "a", "new_string": big}}}},
			{"publish_workspace_session", map[string]any{"workspace_session_id": ws, "message": big}},
		} {
			st, b, err := g.HTTPOp(c.op, map[string]any{"scope": scope, "args": c.args})
			require.NoError(t, err)
			require.Equal(t, http.StatusTooManyRequests, st, "%s: %.300s", c.op, b)
			e := errOf(t, b)
			require.Equal(t, "max_update_args_bytes", e.Details["limit"], "%s: %v", c.op, e)
			require.Equal(t, c.op, e.Details["op"])
		}
		st, _, b := rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"big.txt"}}, nil)
		require.Equal(t, http.StatusNotFound, st, "%s", b)
		// The sandbox's next update is not held up.
		r := rtc("file_write", "--path", "small.txt", "--content", "s\n")
		require.Equal(t, 0, r.code, r.stderr)
	})

	t.Run("path escapes are refused", func(t *testing.T) {
		r := rtc("exec_command", "--workspace-session-id", ws, "ln -s /etc etclink && ln -s /etc/hostname hostlink")
		require.Equal(t, 0, r.code, r.stderr)
		for _, p := range []string{"../outside.bin", "/etc/passwd", "etclink/evil.bin", "hostlink", "a/../../x"} {
			st, _, b := rawFiles(t, g, http.MethodPut, id, url.Values{"path": {p}, "workspace_session_id": {ws}}, []byte{0, 1, 2})
			require.Equal(t, http.StatusBadRequest, st, "%s: %s", p, b)
			require.Equal(t, api.KindInvalidRequest, errOf(t, b).Kind, p)
		}
		st, _, b := rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"hostlink"}, "workspace_session_id": {ws}}, nil)
		require.Equal(t, http.StatusBadRequest, st, "%s", b)
		r = rtc("exec_command", "--workspace-session-id", ws, "test ! -e /etc/evil.bin && cat /etc/hostname | wc -c")
		require.Equal(t, 0, r.code, r.stderr)
		require.NotEqual(t, "3", r.out["output"])
		// No token, no bytes.
		resp, err := testenv.HTTPClient.Get("http://" + g.Addr + "/v1/sandboxes/" + id + "/files?path=cli.bin&workspace_session_id=" + ws)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		// Unknown query parameters and a missing path are refused too.
		st, _, b = rawFiles(t, g, http.MethodGet, id, url.Values{"path": {"x"}, "bogus": {"1"}}, nil)
		require.Equal(t, http.StatusBadRequest, st, "%s", b)
		st, _, b = rawFiles(t, g, http.MethodGet, id, url.Values{}, nil)
		require.Equal(t, http.StatusBadRequest, st, "%s", b)
	})
}
