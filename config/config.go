package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// EnvVar names the gateway YAML, as the seed's start script reads it.
const EnvVar = "SANDBOX_GATEWAY_CONFIG_YAML"

// Config is what the seed's YAML sets here.
type Config struct {
	// AutoSquashAt is the daemon's --autosquash-at: 0 the product default
	// (100 layers), -1 off, else >= 3.
	AutoSquashAt int
	// DaemonMaxRequestBytes is the daemon's request cap (0: 16 MiB).
	DaemonMaxRequestBytes int64
	// Applied and Ignored are the dotted keys found, sorted.
	Applied, Ignored []string
	// Notes are non-fatal remarks (e.g. a daemon YAML that is not there).
	Notes []string
	// DefaultSandboxTTL and DefaultSessionIdleTTL are the gateway YAML's
	// lifecycle.default_sandbox_ttl and lifecycle.default_session_idle_ttl
	// (ours, not the seed's): create_sandbox's defaults (0 = off).
	DefaultSandboxTTL, DefaultSessionIdleTTL time.Duration
}

// Keys the daemon YAML may set (runtime.layerstack.autosquash_policies is
// a map of policies; the seed knows one).
const (
	keyDaemonYAML   = "manager.docker.daemon_config_yaml_path"
	keyAutosquash   = "runtime.layerstack.autosquash_policies"
	keySquashAtN    = "runtime.layerstack.autosquash_policies.squash_at_n_layers"
	keyMaxRequest   = "daemon.server.max_request_bytes"
	minSquashAtN    = 3
	minRequestBytes = 64 << 10
	maxRequestBytes = 1 << 30
)

// Open loads the gateway YAML at path for a process (none: the product
// defaults) and names, in one warning, the keys that only configure the
// seed's internals.
func Open(path string, log *slog.Logger) (*Config, error) {
	if path == "" {
		return &Config{}, nil
	}
	c, err := Load(path)
	if err != nil {
		return nil, err
	}
	if len(c.Ignored) > 0 {
		log.Warn("config keys ignored: they configure the seed's Rust internals", "file", path, "keys", strings.Join(c.Ignored, ","))
	}
	for _, n := range c.Notes {
		log.Warn("config", "file", path, "note", n)
	}
	log.Info("config", "file", path, "applied", strings.Join(c.Applied, ","), "daemon_args", strings.Join(c.DaemonArgs(), " "))
	return c, nil
}

// FromEnv loads the file SANDBOX_GATEWAY_CONFIG_YAML names; without it the
// zero Config (product defaults).
func FromEnv() (*Config, error) {
	p := os.Getenv(EnvVar)
	if p == "" {
		return &Config{}, nil
	}
	return Load(p)
}

// Load reads the gateway YAML at path and the daemon YAML it names.
func Load(path string) (*Config, error) {
	doc, err := readYAML(path)
	if err != nil {
		return nil, err
	}
	c := &Config{}
	flat := map[string]any{}
	flatten("", doc, flat)
	if err := c.applyLifecycle(path, flat); err != nil {
		return nil, err
	}
	if v, ok := flat[keyDaemonYAML]; ok {
		s, ok := v.(string)
		if !ok || s == "" {
			return nil, fmt.Errorf("%s: %s must be a file path, not %v", path, keyDaemonYAML, v)
		}
		c.Applied = append(c.Applied, keyDaemonYAML)
		dp := s
		if !filepath.IsAbs(dp) {
			dp = filepath.Join(filepath.Dir(path), dp)
		}
		var daemonDoc map[string]any
		dd, err := readYAML(dp)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// The seed's baseline names its own product's file; without it
			// the daemon runs on the product defaults.
			c.Notes = append(c.Notes, fmt.Sprintf("daemon config %s not found: sandboxes get the daemon defaults", dp))
		case err != nil:
			return nil, err
		default:
			daemonDoc = map[string]any{}
			flatten("", dd, daemonDoc)
			c.AutoSquashAt = -1 // a daemon YAML without a policy: autosquash off
		}
		if err := c.applyDaemon(dp, daemonDoc); err != nil {
			return nil, err
		}
		// The gateway document's other keys (its own daemon: or runtime:
		// sections included) configure the seed's manager and Rust runtime.
		for k := range flat {
			if k != keyDaemonYAML {
				c.Ignored = append(c.Ignored, k)
			}
		}
	} else if err := c.applyDaemon(path, flat); err != nil {
		return nil, err
	}
	sort.Strings(c.Applied)
	sort.Strings(c.Ignored)
	c.Ignored = slices.Compact(c.Ignored)
	return c, nil
}

// Our lifecycle keys of the gateway YAML.
const (
	keySandboxTTL     = "lifecycle.default_sandbox_ttl"
	keySessionIdleTTL = "lifecycle.default_session_idle_ttl"
)

// applyLifecycle reads (and removes from doc) the lifecycle defaults: Go
// durations such as 30m or 24h, 0 for off, within api.MinTTL..api.MaxTTL.
func (c *Config) applyLifecycle(file string, doc map[string]any) error {
	for k, v := range doc {
		if !strings.HasPrefix(k, "lifecycle.") && k != "lifecycle" {
			continue
		}
		if k == "lifecycle" { // an empty section
			delete(doc, k)
			continue
		}
		var out *time.Duration
		switch k {
		case keySandboxTTL:
			out = &c.DefaultSandboxTTL
		case keySessionIdleTTL:
			out = &c.DefaultSessionIdleTTL
		default:
			return fmt.Errorf("%s: unknown key %s (known: %s, %s)", file, k, keySandboxTTL, keySessionIdleTTL)
		}
		s := fmt.Sprint(v)
		if v == nil {
			s = "0"
		}
		d, err := api.ParseTTL(k, s)
		if err != nil {
			return fmt.Errorf("%s: %s", file, err.Message)
		}
		*out = d
		c.Applied = append(c.Applied, k)
		delete(doc, k)
	}
	return nil
}

func isDaemonKey(k string) bool {
	return k == keyMaxRequest || k == keyAutosquash || len(k) > len(keyAutosquash) && k[:len(keyAutosquash)+1] == keyAutosquash+"."
}

// applyDaemon reads the daemon settings of doc (flattened) from file.
func (c *Config) applyDaemon(file string, doc map[string]any) error {
	for k, v := range doc {
		switch {
		case k == keySquashAtN:
			n, err := intValue(v)
			if err != nil || n < minSquashAtN {
				return fmt.Errorf("%s: %s must be an integer >= %d, not %v", file, keySquashAtN, minSquashAtN, v)
			}
			c.AutoSquashAt = int(n)
			c.Applied = append(c.Applied, k)
		case k == keyAutosquash:
			// An empty policy map (flatten keeps it as a leaf): nothing to
			// squash on.
			if v != nil {
				if m, ok := v.(map[string]any); !ok || len(m) > 0 {
					return fmt.Errorf("%s: %s must be a map of policies, not %v", file, keyAutosquash, v)
				}
			}
			c.AutoSquashAt = -1
			c.Applied = append(c.Applied, k)
		case isDaemonKey(k) && k != keyMaxRequest:
			return fmt.Errorf("%s: unknown autosquash policy %s (known: squash_at_n_layers)", file, k[len(keyAutosquash)+1:])
		case k == keyMaxRequest:
			n, err := intValue(v)
			if err != nil || n < minRequestBytes || n > maxRequestBytes {
				return fmt.Errorf("%s: %s must be an integer within %d..%d, not %v", file, keyMaxRequest, minRequestBytes, maxRequestBytes, v)
			}
			c.DaemonMaxRequestBytes = n
			c.Applied = append(c.Applied, k)
		default:
			if k != keyDaemonYAML {
				c.Ignored = append(c.Ignored, k)
			}
		}
	}
	return nil
}

// DaemonArgs are the sandbox-daemon flags of c (none for the defaults).
func (c *Config) DaemonArgs() []string {
	var args []string
	if c.AutoSquashAt != 0 {
		args = append(args, "--autosquash-at", strconv.Itoa(c.AutoSquashAt))
	}
	if c.DaemonMaxRequestBytes != 0 {
		args = append(args, "--max-request-bytes", strconv.FormatInt(c.DaemonMaxRequestBytes, 10))
	}
	return args
}

func readYAML(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("config %s: not valid YAML: %w", path, err)
	}
	return doc, nil
}

// flatten turns nested maps into dotted keys; lists and scalars are leaves,
// and so is an empty map.
func flatten(prefix string, m map[string]any, out map[string]any) {
	for k, v := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			flatten(key, sub, out)
			continue
		}
		out[key] = v
	}
}

func intValue(v any) (int64, error) {
	switch n := v.(type) {
	case int:
		return int64(n), nil
	case int64:
		return n, nil
	case uint64:
		if n > 1<<62 {
			return 0, fmt.Errorf("too large")
		}
		return int64(n), nil
	}
	return 0, fmt.Errorf("not an integer: %v", v)
}
