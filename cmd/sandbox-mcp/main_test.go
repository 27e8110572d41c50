package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSetupCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	var out, errb bytes.Buffer
	code := run([]string{"setup", "codex", "--dry-run", "--config", cfg, "--binary", "/opt/sandbox-mcp"}, strings.NewReader(""), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	require.Contains(t, out.String(), "# dry run: would write "+cfg)
	require.Contains(t, out.String(), "[mcp_servers.ephemeral-os-runtime]")
	_, err := os.Stat(cfg)
	require.True(t, os.IsNotExist(err), "a dry run writes nothing")

	out.Reset()
	require.Equal(t, 0, run([]string{"setup", "codex", "--config", cfg, "--binary", "/opt/sandbox-mcp"}, nil, &out, &errb))
	require.Contains(t, out.String(), "registered [ephemeral-os-management ephemeral-os-runtime ephemeral-os-observability]")
	out.Reset()
	require.Equal(t, 0, run([]string{"setup", "codex", "--config", cfg, "--binary", "/opt/sandbox-mcp"}, nil, &out, &errb))
	require.Contains(t, out.String(), "nothing changed")

	claude := filepath.Join(dir, ".claude.json")
	require.Equal(t, 0, run([]string{"setup", "claude", "--config", claude, "--binary", "/opt/sandbox-mcp", "--gateway-endpoint", "127.0.0.1:9999"}, nil, &out, &errb))
	b, err := os.ReadFile(claude)
	require.NoError(t, err)
	require.Contains(t, string(b), `"--gateway-endpoint"`)

	errb.Reset()
	require.Equal(t, 2, run([]string{"setup", "claude", "--config", claude, "--gateway-auth-token", "secret"}, nil, &out, &errb))
	require.Contains(t, errb.String(), "does not write tokens")
	require.NotContains(t, string(b), "secret")

	errb.Reset()
	require.Equal(t, 2, run([]string{"--set", "nope"}, nil, &out, &errb))
	require.Contains(t, errb.String(), "--set must be")

	errb.Reset()
	require.Equal(t, 2, run([]string{"--set", "runtime", "--gateway-token-file", filepath.Join(dir, "missing.token")}, strings.NewReader(""), &out, &errb))
	require.Contains(t, errb.String(), "--gateway-token-file", "a named token file that is not there is an error, not no token")
}
