package config

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLifecycleDefaults(t *testing.T) {
	dir := t.TempDir()
	c, err := Load(write(t, dir, "g.yaml", "lifecycle:\n  default_sandbox_ttl: 24h\n  default_session_idle_ttl: 30m\n"))
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, c.DefaultSandboxTTL)
	require.Equal(t, 30*time.Minute, c.DefaultSessionIdleTTL)
	require.Empty(t, c.Ignored)

	// Beside the seed's baseline (a daemon YAML named): applied, not ignored.
	d := write(t, dir, "d.yaml", "daemon:\n  server:\n    max_request_bytes: 65536\n")
	c, err = Load(write(t, dir, "g2.yaml", fmt.Sprintf(seedBaseline, d)+"lifecycle:\n  default_session_idle_ttl: 90s\n"))
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, c.DefaultSessionIdleTTL)
	require.Contains(t, c.Applied, keySessionIdleTTL)
	require.NotContains(t, c.Ignored, keySessionIdleTTL)

	c, err = Load(write(t, dir, "g3.yaml", "lifecycle:\n  default_sandbox_ttl: 0\n"))
	require.NoError(t, err)
	require.Zero(t, c.DefaultSandboxTTL)

	for _, bad := range []string{"default_sandbox_ttl: -5m", "default_sandbox_ttl: soon", "default_session_idle_ttl: 1ms",
		"default_sandbox_ttl: 9000h", "default_sandbox_tll: 1h"} {
		_, err := Load(write(t, dir, "bad.yaml", "lifecycle:\n  "+bad+"\n"))
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "lifecycle.", bad)
	}
}
