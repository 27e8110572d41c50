package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// MCP clients Setup registers the three servers with.
const (
	ClientCodex  = "codex"
	ClientClaude = "claude"
)

// SetupOptions say which client's configuration to write and how the
// servers are launched.
type SetupOptions struct {
	Client string // codex or claude
	// Binary is the absolute path of sandbox-mcp the client launches.
	Binary string
	// Endpoint and TokenFile, when set, are passed to every server
	// (--gateway-endpoint, --gateway-token-file). The token itself is never
	// written into a client's configuration.
	Endpoint  string
	TokenFile string
	// Config overrides the configuration file (default: $CODEX_HOME or
	// ~/.codex/config.toml; ~/.claude.json, or ./.mcp.json with Scope
	// "project").
	Config string
	Scope  string // claude: user (default) or project
	DryRun bool
}

// SetupResult says what Setup wrote (or, in a dry run, would write).
type SetupResult struct {
	Path    string `json:"path"`
	Changed bool   `json:"changed"`
	DryRun  bool   `json:"dry_run"`
	Servers []string
	// Content is the file's new content.
	Content string `json:"-"`
}

// launch is how a client starts one server.
type launch struct {
	Name string
	Args []string
}

func (o *SetupOptions) launches() []launch {
	var out []launch
	for _, set := range Sets() {
		args := []string{"--set", set}
		if o.Endpoint != "" {
			args = append(args, "--gateway-endpoint", o.Endpoint)
		}
		if o.TokenFile != "" {
			args = append(args, "--gateway-token-file", o.TokenFile)
		}
		out = append(out, launch{Name: ServerName(set), Args: args})
	}
	return out
}

// Setup registers the management, runtime and observability servers with
// an MCP client by writing its configuration. It is idempotent: running it
// again with the same options changes nothing; other servers and settings
// in the file are kept as they are.
func Setup(o SetupOptions) (*SetupResult, error) {
	if !filepath.IsAbs(o.Binary) {
		return nil, fmt.Errorf("setup: the sandbox-mcp binary path must be absolute, got %q", o.Binary)
	}
	path, err := o.configPath()
	if err != nil {
		return nil, err
	}
	old, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	var updated []byte
	switch o.Client {
	case ClientCodex:
		updated, err = codexConfig(old, o)
	case ClientClaude:
		updated, err = claudeConfig(old, o)
	default:
		return nil, fmt.Errorf("setup: unknown client %q (codex or claude)", o.Client)
	}
	if err != nil {
		return nil, fmt.Errorf("setup %s (%s): %w", o.Client, path, err)
	}
	res := &SetupResult{Path: path, Changed: !bytes.Equal(old, updated), DryRun: o.DryRun, Content: string(updated)}
	for _, l := range o.launches() {
		res.Servers = append(res.Servers, l.Name)
	}
	if o.DryRun || !res.Changed {
		return res, nil
	}
	if err := writeAtomic(path, updated); err != nil {
		return nil, err
	}
	return res, nil
}

func (o *SetupOptions) configPath() (string, error) {
	if o.Config != "" {
		return o.Config, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("setup: no home directory: %w", err)
	}
	switch o.Client {
	case ClientCodex:
		if ch := os.Getenv("CODEX_HOME"); ch != "" {
			return filepath.Join(ch, "config.toml"), nil
		}
		return filepath.Join(home, ".codex", "config.toml"), nil
	case ClientClaude:
		if o.Scope == "project" {
			wd, err := os.Getwd()
			if err != nil {
				return "", err
			}
			return filepath.Join(wd, ".mcp.json"), nil
		}
		return filepath.Join(home, ".claude.json"), nil
	}
	return "", fmt.Errorf("setup: unknown client %q (codex or claude)", o.Client)
}

func readConfig(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("setup: read %s: %w", path, err)
	}
	return b, nil
}

// writeAtomic replaces path with data, keeping the file's mode; a new file
// is 0600 (client configs can hold secrets).
func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFileKeepMode(path, data, 0o600)
}

// --- Codex: ~/.codex/config.toml ---

const (
	codexBegin = "# BEGIN ephemeral-sandbox MCP servers (written by `sandbox-mcp setup codex`; edits inside are replaced)"
	codexEnd   = "# END ephemeral-sandbox MCP servers"
)

// codexConfig puts the [mcp_servers.<name>] tables in one marked block,
// replacing the block of an earlier run and leaving the rest of the file
// byte for byte.
func codexConfig(old []byte, o SetupOptions) ([]byte, error) {
	text := string(old)
	before, after := text, ""
	if i := strings.Index(text, codexBegin); i >= 0 {
		j := strings.Index(text[i:], codexEnd)
		if j < 0 {
			return nil, errors.New("found the start of the ephemeral-sandbox block but not its end marker; fix the file by hand")
		}
		before, after = text[:i], strings.TrimPrefix(text[i+j+len(codexEnd):], "\n")
	}
	// The tables must not also be defined outside the block: TOML forbids
	// a table twice.
	var rest map[string]any
	if err := toml.Unmarshal([]byte(before+after), &rest); err != nil {
		return nil, fmt.Errorf("the existing file is not valid TOML: %w", err)
	}
	servers, _ := rest["mcp_servers"].(map[string]any)
	for _, l := range o.launches() {
		if _, dup := servers[l.Name]; dup {
			return nil, fmt.Errorf("[mcp_servers.%s] is already defined outside the ephemeral-sandbox block; remove it and run setup again", l.Name)
		}
	}
	var b strings.Builder
	b.WriteString(codexBegin + "\n")
	for _, l := range o.launches() {
		fmt.Fprintf(&b, "[mcp_servers.%s]\ncommand = %s\nargs = [", l.Name, strconv.Quote(o.Binary))
		for i, a := range l.Args {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Quote(a))
		}
		b.WriteString("]\n\n")
	}
	b.WriteString(codexEnd + "\n")
	if before != "" && !strings.HasSuffix(before, "\n") {
		before += "\n"
	}
	if before != "" && after == "" && !strings.HasSuffix(before, "\n\n") && !strings.Contains(text, codexBegin) {
		before += "\n"
	}
	out := before + b.String() + after
	var check map[string]any
	if err := toml.Unmarshal([]byte(out), &check); err != nil {
		return nil, fmt.Errorf("the new file would not be valid TOML (%v); nothing written", err)
	}
	return []byte(out), nil
}

// --- Claude Code: ~/.claude.json or ./.mcp.json ---

// claudeConfig sets mcpServers.<name> for each server, keeping every other
// key of the file and their order.
func claudeConfig(old []byte, o SetupOptions) ([]byte, error) {
	top, err := decodeOrdered(old)
	if err != nil {
		return nil, err
	}
	var servers orderedObject
	if raw, ok := top.get("mcpServers"); ok {
		if servers, err = decodeOrdered(raw); err != nil {
			return nil, fmt.Errorf("mcpServers: %w", err)
		}
	}
	changed := false
	for _, l := range o.launches() {
		entry, _ := json.Marshal(struct {
			Type    string            `json:"type"`
			Command string            `json:"command"`
			Args    []string          `json:"args"`
			Env     map[string]string `json:"env"`
		}{"stdio", o.Binary, l.Args, map[string]string{}})
		if raw, ok := servers.get(l.Name); ok && jsonEqual(raw, entry) {
			continue
		}
		servers.set(l.Name, entry)
		changed = true
	}
	if !changed {
		return old, nil // a rerun leaves the file byte for byte
	}
	top.set("mcpServers", servers.encode())
	var out bytes.Buffer
	if err := json.Indent(&out, top.encode(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// orderedObject is a JSON object whose keys keep their order.
type orderedObject []struct {
	key string
	val json.RawMessage
}

func decodeOrdered(b []byte) (orderedObject, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var out orderedObject
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not valid JSON: %w", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("not valid JSON: %w", err)
		}
		out.set(kt.(string), v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	return out, nil
}

func (o orderedObject) get(k string) (json.RawMessage, bool) {
	for _, e := range o {
		if e.key == k {
			return e.val, true
		}
	}
	return nil, false
}

func (o *orderedObject) set(k string, v json.RawMessage) {
	for i := range *o {
		if (*o)[i].key == k {
			(*o)[i].val = v
			return
		}
	}
	*o = append(*o, struct {
		key string
		val json.RawMessage
	}{k, v})
}

func (o orderedObject) encode() json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(e.key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(e.val)
	}
	b.WriteByte('}')
	return b.Bytes()
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}
