package config

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// seedBaseline is the seed suite's baseline gateway document (abridged):
// Rust internals only, and a daemon YAML of the seed's own product.
const seedBaseline = `daemon:
  server:
    socket_path: /eos/runtime/daemon/runtime.sock
    max_worker_threads: 32
runtime:
  workspace:
    layer_stack_root: /eos/layer-stack
manager:
  docker:
    privileged: false
    daemon_binary_path: dist/sandbox-daemon-linux-arm64
    daemon_config_yaml_path: %s
    container_env:
      HTTP_PROXY: http://http.docker.internal:3128
`

func write(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	return p
}

func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name      string
		daemon    string // daemon YAML text; "" for none written
		daemonRef string // daemon_config_yaml_path
		wantArgs  []string
		wantErr   string
		ignored   []string
	}{
		{name: "daemon yaml without a policy: autosquash off", daemon: "daemon:\n  server:\n    pid_path: /x\n",
			daemonRef: "daemon.yml", wantArgs: []string{"--autosquash-at", "-1"},
			ignored: []string{"daemon.server.max_worker_threads", "daemon.server.pid_path", "daemon.server.socket_path", "manager.docker.container_env.HTTP_PROXY",
				"manager.docker.daemon_binary_path", "manager.docker.privileged", "runtime.workspace.layer_stack_root"}},
		{name: "squash_at_n_layers and the request cap", daemon: "runtime:\n  layerstack:\n    autosquash_policies:\n      squash_at_n_layers: 7\ndaemon:\n  server:\n    max_request_bytes: 65536\n",
			daemonRef: "daemon.yml", wantArgs: []string{"--autosquash-at", "7", "--max-request-bytes", "65536"}},
		{name: "missing daemon yaml: product defaults", daemonRef: "config/prd.yml", wantArgs: nil},
		{name: "squash_at_n_layers below 3", daemon: "runtime:\n  layerstack:\n    autosquash_policies:\n      squash_at_n_layers: 2\n",
			daemonRef: "daemon.yml", wantErr: "squash_at_n_layers must be an integer >= 3, not 2"},
		{name: "squash_at_n_layers not a number", daemon: "runtime:\n  layerstack:\n    autosquash_policies:\n      squash_at_n_layers: many\n",
			daemonRef: "daemon.yml", wantErr: "squash_at_n_layers must be an integer >= 3, not many"},
		{name: "unknown policy", daemon: "runtime:\n  layerstack:\n    autosquash_policies:\n      squash_every_n_layers: 100\n",
			daemonRef: "daemon.yml", wantErr: "unknown autosquash policy squash_every_n_layers"},
		{name: "request cap under the floor", daemon: "daemon:\n  server:\n    max_request_bytes: 1024\n",
			daemonRef: "daemon.yml", wantErr: "daemon.server.max_request_bytes must be an integer within 65536..1073741824, not 1024"},
		{name: "malformed daemon yaml", daemon: "runtime: [unclosed\n", daemonRef: "daemon.yml", wantErr: "not valid YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.daemon != "" {
				write(t, dir, "daemon.yml", tc.daemon)
			}
			gw := write(t, dir, "gateway.yml", fmt.Sprintf(seedBaseline, tc.daemonRef))
			c, err := Load(gw)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantArgs, c.DaemonArgs())
			if tc.ignored != nil {
				require.Equal(t, tc.ignored, c.Ignored)
			}
		})
	}
}

func TestLoadOneDocument(t *testing.T) {
	dir := t.TempDir()
	gw := write(t, dir, "gateway.yml", "runtime:\n  layerstack:\n    autosquash_policies: {}\n")
	c, err := Load(gw)
	require.NoError(t, err)
	require.Equal(t, []string{"--autosquash-at", "-1"}, c.DaemonArgs(), "an empty policy map turns autosquash off")

	t.Setenv(EnvVar, "")
	c, err = FromEnv()
	require.NoError(t, err)
	require.Nil(t, c.DaemonArgs(), "no YAML: the product defaults")
	t.Setenv(EnvVar, filepath.Join(dir, "missing.yml"))
	_, err = FromEnv()
	require.ErrorContains(t, err, "missing.yml")
}

// TestSeedSuiteConfig: the YAML `make seed-suite` starts the gateway on is
// the seed runtime suite's: autosquash off, nothing else of ours changed.
func TestSeedSuiteConfig(t *testing.T) {
	c, err := Load(filepath.Join("..", "deploy", "seed-suite", "gateway.yml"))
	require.NoError(t, err)
	require.Equal(t, []string{"--autosquash-at", "-1"}, c.DaemonArgs())
	require.Contains(t, c.Ignored, "runtime.workspace.layer_stack_root")
	require.Empty(t, c.Notes)
}
