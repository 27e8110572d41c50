package mcp_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/mcp"
)

func TestSetupCodex(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	user := "# my settings\nmodel = \"o3\"\n\n[mcp_servers.other]\ncommand = \"other\"\n"
	require.NoError(t, os.WriteFile(cfg, []byte(user), 0o644))
	require.NoError(t, os.Chmod(cfg, 0o644)) // the mode the rewrite must keep, whatever the umask
	o := mcp.SetupOptions{Client: mcp.ClientCodex, Binary: "/opt/eos/sandbox-mcp", Endpoint: "127.0.0.1:7979", Config: cfg}

	dry := o
	dry.DryRun = true
	res, err := mcp.Setup(dry)
	require.NoError(t, err)
	require.True(t, res.Changed)
	b, _ := os.ReadFile(cfg)
	require.Equal(t, user, string(b), "a dry run writes nothing")

	res, err = mcp.Setup(o)
	require.NoError(t, err)
	require.True(t, res.Changed)
	b, _ = os.ReadFile(cfg)
	require.Equal(t, res.Content, string(b))
	var doc struct {
		Model      string `toml:"model"`
		MCPServers map[string]struct {
			Command string   `toml:"command"`
			Args    []string `toml:"args"`
		} `toml:"mcp_servers"`
	}
	require.NoError(t, toml.Unmarshal([]byte(res.Content), &doc))
	require.Equal(t, "o3", doc.Model)
	require.Equal(t, "other", doc.MCPServers["other"].Command, "other servers are kept")
	for _, set := range mcp.Sets() {
		s := doc.MCPServers[mcp.ServerName(set)]
		require.Equal(t, "/opt/eos/sandbox-mcp", s.Command)
		require.Equal(t, []string{"--set", set, "--gateway-endpoint", "127.0.0.1:7979"}, s.Args)
	}
	require.True(t, strings.HasPrefix(res.Content, user), "the user's part of the file is untouched")
	st, _ := os.Stat(cfg)
	require.Equal(t, os.FileMode(0o644), st.Mode().Perm(), "the file keeps its mode")

	again, err := mcp.Setup(o)
	require.NoError(t, err)
	require.False(t, again.Changed, "a rerun changes nothing")

	// A new binary path replaces the block, not appends a second one.
	o.Binary = "/usr/local/bin/sandbox-mcp"
	res, err = mcp.Setup(o)
	require.NoError(t, err)
	require.True(t, res.Changed)
	require.Equal(t, 1, strings.Count(res.Content, "[mcp_servers.ephemeral-os-runtime]"))
	require.Contains(t, res.Content, `command = "/usr/local/bin/sandbox-mcp"`)

	// Hand-written tables of the same name are not duplicated.
	dup := filepath.Join(dir, "dup.toml")
	require.NoError(t, os.WriteFile(dup, []byte("[mcp_servers.ephemeral-os-runtime]\ncommand = \"x\"\n"), 0o600))
	o.Config = dup
	_, err = mcp.Setup(o)
	require.ErrorContains(t, err, "already defined outside")

	bad := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("this is = = not toml"), 0o600))
	o.Config = bad
	_, err = mcp.Setup(o)
	require.ErrorContains(t, err, "not valid TOML")

	// A fresh file is created 0600.
	fresh := filepath.Join(dir, "sub", "config.toml")
	o.Config = fresh
	_, err = mcp.Setup(o)
	require.NoError(t, err)
	st, _ = os.Stat(fresh)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
}

func TestSetupClaude(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, ".claude.json")
	user := `{"numStartups": 3, "mcpServers": {"other": {"type": "stdio", "command": "other", "args": []}}, "zLast": {"keep": true}}`
	require.NoError(t, os.WriteFile(cfg, []byte(user), 0o600))
	o := mcp.SetupOptions{Client: mcp.ClientClaude, Binary: "/opt/eos/sandbox-mcp", Config: cfg, TokenFile: "/secrets/gw.token"}
	res, err := mcp.Setup(o)
	require.NoError(t, err)
	require.True(t, res.Changed)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.Content), &doc))
	require.Equal(t, 3.0, doc["numStartups"])
	require.Equal(t, map[string]any{"keep": true}, doc["zLast"])
	servers := doc["mcpServers"].(map[string]any)
	require.Contains(t, servers, "other")
	for _, set := range mcp.Sets() {
		s := servers[mcp.ServerName(set)].(map[string]any)
		require.Equal(t, "stdio", s["type"])
		require.Equal(t, "/opt/eos/sandbox-mcp", s["command"])
		require.Equal(t, []any{"--set", set, "--gateway-token-file", "/secrets/gw.token"}, s["args"])
	}
	require.Less(t, strings.Index(res.Content, "numStartups"), strings.Index(res.Content, "zLast"), "key order is kept")
	require.Less(t, strings.Index(res.Content, `"other"`), strings.Index(res.Content, "ephemeral-os-management"))

	b1, _ := os.ReadFile(cfg)
	again, err := mcp.Setup(o)
	require.NoError(t, err)
	require.False(t, again.Changed)
	b2, _ := os.ReadFile(cfg)
	require.Equal(t, b1, b2, "a rerun leaves the file byte for byte")

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`[1,2]`), 0o600))
	o.Config = bad
	_, err = mcp.Setup(o)
	require.ErrorContains(t, err, "not a JSON object")

	_, err = mcp.Setup(mcp.SetupOptions{Client: "vim", Binary: "/x", Config: cfg})
	require.ErrorContains(t, err, "unknown client")
	_, err = mcp.Setup(mcp.SetupOptions{Client: mcp.ClientClaude, Binary: "relative/sandbox-mcp", Config: cfg})
	require.ErrorContains(t, err, "absolute")
}
