package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDaemonHTTPWithoutToken: the two answers the seed gives without a
// token — a /health that reveals nothing but liveness and the 400 of a
// malformed forward route — and nothing else: a well-formed forward, the
// file listing and the RPC still need the sandbox token.
func TestDaemonHTTPWithoutToken(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	get := func(path, auth string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, sb.baseURL+path, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := sb.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(raw, &out), "%s: %s", path, raw)
		return resp.StatusCode, out
	}
	status, h := get("/health", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, map[string]any{"status": "ok", "service": "daemon_http"}, h, "nothing but liveness without a token")
	status, h = get("/health", "Bearer "+sb.token)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, h, "daemon_pid", "the full health document with the token")
	require.Contains(t, h, "in_flight_ops")

	for path, want := range map[string]int{
		"/forward/shared/not-a-port/":     http.StatusBadRequest,
		"/forward/shared/0/":              http.StatusBadRequest,
		"/forward/isolated=missing/3000/": http.StatusUnauthorized,
		"/forward/shared/3000/":           http.StatusUnauthorized,
		"/files/list":                     http.StatusUnauthorized,
		"/not-forward/shared/3000/":       http.StatusUnauthorized,
	} {
		status, _ := get(path, "")
		require.Equal(t, want, status, path)
	}
	status, _ = get("/forward/isolated=missing/3000/", "Bearer "+sb.token)
	require.Equal(t, http.StatusNotFound, status, "an unknown isolated workspace, with the token")
}

// TestSeedFileRules: file_read's seed content and the seed's error kinds,
// in a session and on the published head.
func TestSeedFileRules(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws := sb.session(nil)
	sb.exec(ws, `printf '\357\273\277one\r\ntwo\r\nthree\r\n' > crlf.txt; printf 'caf\351\n' > latin1.txt; mkdir -p adir; printf 'x' > afile`)
	for _, w := range []string{ws, ""} {
		if w == "" {
			sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})
		}
		r := sb.ok("file_read", map[string]any{"path": "crlf.txt", "offset": 2, "limit": 2, "workspace_session_id": w})
		require.Equal(t, "two\nthree", r["content"], "BOM and CRLF normalised, no final newline")
		require.Equal(t, float64(3), r["total_lines"])
		e := sb.fail("file_read", map[string]any{"path": "latin1.txt", "workspace_session_id": w}, "invalid_request")
		require.Contains(t, e["message"], "not valid UTF-8")
		e = sb.fail("file_edit", map[string]any{"path": "latin1.txt", "edits": []map[string]any{{"old_string": "caf", "new_string": "CAF"}}, "workspace_session_id": w}, "invalid_request")
		require.Contains(t, e["message"], "not valid UTF-8")
		sb.fail("file_write", map[string]any{"path": "adir", "content": "x", "workspace_session_id": w}, "invalid_request")
		sb.fail("file_write", map[string]any{"path": "afile/under.txt", "content": "x", "workspace_session_id": w}, "invalid_request")
	}
	e := sb.fail("file_write", map[string]any{"path": "layers/evil.txt", "content": "x"}, "operation_failed")
	require.Equal(t, "protected_path", e["details"].(map[string]any)["publish_rejection"].(map[string]any)["reason"])
	sb.fail("file_blame", map[string]any{"path": "f.txt/../f.txt"}, "not_found")
	e = sb.fail("exec_command", map[string]any{"cmd": "true", "workspace_session_id": ws}, "operation_failed")
	require.Equal(t, "workspace session not found: "+ws, e["message"], "the published session is gone")
}
