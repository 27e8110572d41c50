package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWarmSessionsFlagRange: a pool outside 0..MaxWarmSessions is a usage
// error (exit 2) before the daemon touches its state dir.
func TestWarmSessionsFlagRange(t *testing.T) {
	state := t.TempDir() + "/state"
	for _, v := range []string{"-1", "5", "1000"} {
		require.Equal(t, 2, serve([]string{"--warm-sessions", v, "--state-dir", state}), v)
	}
	require.NoDirExists(t, state, "a refused flag changes nothing")
}

func TestIngressGuardFlagValues(t *testing.T) {
	state := t.TempDir() + "/state"
	for _, v := range []string{"", "yes", "ON", "1"} {
		require.Equal(t, 2, serve([]string{"--ingress-guard=" + v, "--state-dir", state}), v)
	}
	require.NoDirExists(t, state, "a refused flag changes nothing")
}
