package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/worker"
)

// TestFrontDoors runs the real gateway process and knocks on every door as
// a stranger: its embedded Temporal, its HTTP listener under a foreign Host,
// host paths outside the rule, and a sandbox's daemon under a foreign Host.
func TestFrontDoors(t *testing.T) {
	g := startGatewayProcess(t)
	secret, err := worker.LoadOrCreateSecret(filepath.Join(g.StateDir, "gateway.secret"))
	require.NoError(t, err)
	m := regexp.MustCompile(`embedded Temporal at (\S+) `).FindStringSubmatch(g.Stderr.String())
	require.NotNil(t, m, "the gateway names its Temporal address: %s", g.Stderr.String())
	temporalAddr := m[1]
	require.Contains(t, g.Stderr.String(), "UI off", "the Temporal UI is off by default")

	// Temporal: this test process is a stranger to it.
	quiet := sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))
	_, err = client.Dial(client.Options{HostPort: temporalAddr, Logger: quiet})
	require.Error(t, err, "a client without the deployment secret's token is refused")
	tc, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: quiet, HeadersProvider: worker.Headers(secret)})
	require.NoError(t, err, "the product's token is admitted")
	defer tc.Close()
	workflowCount := func() int {
		resp, err := tc.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{})
		require.NoError(t, err)
		return len(resp.Executions)
	}

	// The gateway under a foreign Host.
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, g.Addr: http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+g.Addr+"/healthz", nil)
		req.Host = host
		resp, err := testenv.HTTPClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, host)
	}

	// Host paths: refused as invalid_request before any workflow starts.
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "f.txt"), "base\n")
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(ws, link))
	outside := filepath.Join(testenv.RepoRoot(), "hostpath") // the source tree is not an allowed root
	exportOutside := filepath.Join(testenv.RepoRoot(), "eos-export-must-not-exist")
	refused := func(op string, args map[string]any, rule string) {
		t.Helper()
		st, body, err := g.HTTPOp(op, map[string]any{"args": args})
		require.NoError(t, err)
		var env struct {
			Error struct {
				Kind    string         `json:"kind"`
				Message string         `json:"message"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(body, &env), "%s", body)
		require.Equal(t, http.StatusBadRequest, st, "%s %v: %s", op, args, body)
		require.Equal(t, "invalid_request", env.Error.Kind, "%s", body)
		require.Equal(t, rule, env.Error.Details["rule"], "%s", body)
	}
	for root, rule := range map[string]string{"/": hostpath.RuleSystem, "/etc": hostpath.RuleSystem, link: hostpath.RuleSymlink,
		outside: hostpath.RuleRoots, g.StateDir: hostpath.RuleProtected} {
		refused("create_sandbox", map[string]any{"image": testenv.Images[0], "workspace_root": root}, rule)
	}
	for dest, rule := range map[string]string{"/": hostpath.RuleSystem, "/etc": hostpath.RuleSystem, link: hostpath.RuleSymlink,
		exportOutside: hostpath.RuleRoots, filepath.Join(g.StateDir, "x"): hostpath.RuleProtected} {
		refused("export_changes", map[string]any{"sandbox_id": "eos-nosuch", "dest": dest}, rule)
	}
	require.Zero(t, workflowCount(), "no workflow started for a refused request")
	_, err = os.Lstat(exportOutside)
	require.True(t, os.IsNotExist(err), "nothing written outside the allowed roots")

	// A real sandbox: its daemon refuses a foreign Host, answers loopback.
	st, body, err := g.HTTPOp("create_sandbox", map[string]any{"args": map[string]any{"image": testenv.Images[0], "workspace_root": ws}})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, st, "%s", body)
	var rec struct {
		ID     string `json:"id"`
		Daemon struct {
			Host string `json:"host"`
			Port int    `json:"port"`
		} `json:"daemon"`
	}
	require.NoError(t, json.Unmarshal(body, &rec))
	cleanupSandbox(t, rec.ID)
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, fmt.Sprintf("127.0.0.1:%d", rec.Daemon.Port): http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/health", rec.Daemon.Port), nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+daemonclient.Token(secret, rec.ID))
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, "daemon, Host %s", host)
	}
	// The export to a symlink is refused for the real sandbox too.
	refused("export_changes", map[string]any{"sandbox_id": rec.ID, "dest": link}, hostpath.RuleSymlink)
	st, body, err = g.HTTPOp("export_changes", map[string]any{"args": map[string]any{"sandbox_id": rec.ID, "dest": filepath.Join(t.TempDir(), "out")}})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, st, "an export inside the allowed roots runs: %s", body)
}
