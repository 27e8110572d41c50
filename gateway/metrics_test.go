package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// get sends a GET with the bearer token ("" = none).
func get(t *testing.T, addr, path, token string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func scrape(t *testing.T, addr, token string) (int, string) {
	t.Helper()
	st, b := get(t, addr, "/metrics", token)
	return st, string(b)
}

// publishBackend answers publishes from a table of outcomes.
type publishBackend struct {
	fakeBackend
	next []any // json.RawMessage or error
}

func (p *publishBackend) Lifecycle(ctx context.Context, op, id string, args map[string]any) (any, error) {
	if op != "publish_workspace_session" || len(p.next) == 0 {
		return p.fakeBackend.Lifecycle(ctx, op, id, args)
	}
	v := p.next[0]
	p.next = p.next[1:]
	if err, ok := v.(error); ok {
		return nil, err
	}
	return v, nil
}

func (p *publishBackend) Runtime(ctx context.Context, op, id string, args map[string]any) (any, error) {
	if op == "exec_command" || op == "read_command_lines" {
		return json.RawMessage(`{"status":"ok","command_session_id":"c1","publish_rejected":false,"publish":{"no_op":false,"merged_paths":["a.txt"]}}`), nil
	}
	return p.fakeBackend.Runtime(ctx, op, id, args)
}

func TestMetricsCountOperationsAndPublishes(t *testing.T) {
	pb := &publishBackend{next: []any{
		json.RawMessage(`{"publish":{"no_op":false,"merged_paths":[]}}`),
		json.RawMessage(`{"publish":{"no_op":false,"merged_paths":["x.go"]}}`),
		json.RawMessage(`{"publish":{"no_op":true}}`),
		&api.Error{Kind: "operation_failed", Message: "publish rejected", Details: map[string]any{"conflicts": []any{map[string]any{"path": "x"}}}},
	}}
	s := New(pb, testToken, nil)
	addr := serve(t, s)

	st, _ := scrape(t, addr, "")
	require.Equal(t, http.StatusUnauthorized, st, "metrics need the token")

	st, before := scrape(t, addr, testToken)
	require.Equal(t, http.StatusOK, st)
	require.NotContains(t, before, `eos_operations_total{op="list_sandboxes",outcome="ok"}`)

	post(t, addr, "list_sandboxes", "Bearer "+testToken, []byte(`{}`))
	post(t, addr, "file_read", "Bearer "+testToken, []byte(`{"scope":{"kind":"sandbox","sandbox_id":"eos-1"},"args":{"path":"a"}}`))
	post(t, addr, "file_read", "Bearer "+testToken, []byte(`{"scope":{"kind":"sandbox","sandbox_id":"eos-1"},"args":{}}`))
	for i := 0; i < 4; i++ {
		post(t, addr, "publish_workspace_session", "Bearer "+testToken, []byte(`{"scope":{"kind":"sandbox","sandbox_id":"eos-1"},"args":{"workspace_session_id":"ws-1"}}`))
	}
	post(t, addr, "exec_command", "Bearer "+testToken, []byte(`{"scope":{"kind":"sandbox","sandbox_id":"eos-1"},"args":{"cmd":"true"}}`))
	post(t, addr, "read_command_lines", "Bearer "+testToken, []byte(`{"scope":{"kind":"sandbox","sandbox_id":"eos-1"},"args":{"command_session_id":"c1"}}`))

	_, after := scrape(t, addr, testToken)
	for _, want := range []string{
		`eos_operations_total{op="list_sandboxes",outcome="ok"} 1`,
		`eos_operations_total{op="file_read",outcome="not_found"} 1`,
		`eos_operations_total{op="file_read",outcome="invalid_request"} 1`,
		`eos_operation_duration_seconds_count{op="list_sandboxes",outcome="ok"} 1`,
		`eos_publishes_total{kind="session",outcome="clean"} 1`,
		`eos_publishes_total{kind="session",outcome="merged"} 1`,
		`eos_publishes_total{kind="session",outcome="no_op"} 1`,
		`eos_publishes_total{kind="session",outcome="conflict"} 1`,
		`eos_publishes_total{kind="implicit",outcome="merged"} 1`,
		`go_goroutines`,
	} {
		require.Contains(t, after, want)
	}
	require.True(t, strings.Contains(after, "# TYPE eos_operation_duration_seconds histogram"))
}

type healthBackend struct {
	fakeBackend
	critical bool
	daemon   string
}

func (h *healthBackend) Health(ctx context.Context) (map[string]any, bool) {
	return map[string]any{"temporal": map[string]any{"status": "ok"}, "docker": map[string]any{"status": "ok"},
		"sandboxes": []map[string]any{{"sandbox_id": "eos-1", "daemon": h.daemon}}}, h.critical
}

func TestHealthz(t *testing.T) {
	hb := &healthBackend{critical: true, daemon: "not_ready"}
	addr := serve(t, New(hb, testToken, nil))
	health := func(token string) (int, map[string]any) {
		st, b := get(t, addr, "/healthz", token)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		return st, m
	}
	st, m := health("")
	require.Equal(t, http.StatusOK, st)
	require.Equal(t, map[string]any{"status": "ok", "service": "sandbox-gateway"}, m, "without the token: nothing about sandboxes")
	st, m = health("wrong")
	require.Equal(t, http.StatusOK, st)
	require.NotContains(t, m, "sandboxes")

	st, m = health(testToken)
	require.Equal(t, http.StatusOK, st)
	require.Equal(t, "ok", m["status"], "a sandbox still being created is not a fault")
	hb.daemon = "unavailable"
	st, m = health(testToken)
	require.Equal(t, http.StatusOK, st)
	require.Equal(t, "degraded", m["status"], "a dead daemon degrades the report")
	require.Len(t, m["sandboxes"], 1)

	hb.critical = false
	st, m = health(testToken)
	require.Equal(t, http.StatusServiceUnavailable, st)
	require.Equal(t, "down", m["status"])
}

func TestAsyncPublishIsNotCountedAsAnOutcome(t *testing.T) {
	pb := &publishBackend{next: []any{json.RawMessage(`{"status":"accepted","workflow_id":"sandbox/eos-1","update_id":"u"}`)}}
	addr := serve(t, New(pb, testToken, nil))
	post(t, addr, "publish_workspace_session", "Bearer "+testToken, []byte(`{"scope":{"kind":"sandbox","sandbox_id":"eos-1"},"args":{"workspace_session_id":"ws-1","async":true}}`))
	_, m := scrape(t, addr, testToken)
	require.Contains(t, m, `eos_operations_total{op="publish_workspace_session",outcome="ok"} 1`)
	require.NotContains(t, m, `eos_publishes_total{kind="session"`)
}
