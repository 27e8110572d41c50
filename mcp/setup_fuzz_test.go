package mcp

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// FuzzClientConfigs feeds arbitrary existing files to both config writers:
// they either refuse the file or write one that parses, holds our three
// servers, and is left byte for byte by a second run.
func FuzzClientConfigs(f *testing.F) {
	for _, seed := range []string{"", "{}", `{"a":1,"mcpServers":{"x":{"command":"y"}}}`, "model = \"o3\"\n[mcp_servers.other]\ncommand = \"x\"\n",
		codexBegin + "\n" + codexEnd + "\n", "[a]\nb = 1\n" + codexBegin + "\n[mcp_servers.x]\n", `{"mcpServers": [1]}`, "\xff\xfe"} {
		f.Add([]byte(seed))
	}
	o := SetupOptions{Binary: "/opt/sandbox-mcp", Endpoint: "127.0.0.1:7878"}
	f.Fuzz(func(t *testing.T, old []byte) {
		if out, err := claudeConfig(old, o); err == nil {
			var v map[string]any
			if err := json.Unmarshal(out, &v); err != nil {
				t.Fatalf("claude config is not JSON: %v\n%s", err, out)
			}
			servers, _ := v["mcpServers"].(map[string]any)
			for _, l := range o.launches() {
				if _, ok := servers[l.Name]; !ok {
					t.Fatalf("claude config lacks %s: %s", l.Name, out)
				}
			}
			again, err := claudeConfig(out, o)
			if err != nil || !bytes.Equal(again, out) {
				t.Fatalf("a second run changed the claude config (%v)", err)
			}
		}
		if out, err := codexConfig(old, o); err == nil {
			var v map[string]any
			if err := toml.Unmarshal(out, &v); err != nil {
				t.Fatalf("codex config is not TOML: %v\n%s", err, out)
			}
			servers, _ := v["mcp_servers"].(map[string]any)
			for _, l := range o.launches() {
				if _, ok := servers[l.Name]; !ok {
					t.Fatalf("codex config lacks %s: %s", l.Name, out)
				}
			}
			again, err := codexConfig(out, o)
			if err != nil || !bytes.Equal(again, out) {
				t.Fatalf("a second run changed the codex config (%v)", err)
			}
		}
	})
}
