package command

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// openFDs counts the test process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// Background children that keep their command's output pipes open cost the
// engine a descriptor and a goroutine per pipe: past MaxLingering the oldest
// pipe is closed (its child gets EPIPE when it writes again), the newest
// ones are still drained, and once the children are gone nothing is left.
func TestLingeringPipesAreBounded(t *testing.T) {
	const maxLingering = 4
	e, h := newTestEngine(t, Options{MaxLingering: maxLingering})
	dir := t.TempDir()
	goFlag, epipe, drained := filepath.Join(dir, "go"), filepath.Join(dir, "epipe"), filepath.Join(dir, "drained")
	base := openFDs(t)

	// The oldest: writes once told to, after its pipes were closed.
	run(t, e, h, api.ExecCommandArgs{Cmd: "(trap '' PIPE; while [ ! -e " + goFlag + " ]; do sleep 0.02; done; echo x || touch " + epipe + ") &"})
	for range 10 {
		out := run(t, e, h, api.ExecCommandArgs{Cmd: "sleep 3000 &"})
		require.Equal(t, api.StatusOK, out.Status)
	}
	e.mu.Lock()
	lingering := len(e.lingering)
	e.mu.Unlock()
	require.LessOrEqual(t, lingering, maxLingering)
	require.LessOrEqual(t, openFDs(t)-base, maxLingering+2, "22 pipes are held by background children")

	require.NoError(t, os.WriteFile(goFlag, nil, 0o600))
	require.Eventually(t, func() bool { _, err := os.Stat(epipe); return err == nil }, 10*time.Second, 10*time.Millisecond,
		"the oldest drained pipe was closed: its child's write fails")

	// The newest are still drained: 1.3 MB does not fit in a pipe, so this
	// child only ends if it is read, and dies of SIGPIPE if it is closed.
	run(t, e, h, api.ExecCommandArgs{Cmd: "(sleep 0.3; seq 200000; touch " + drained + ") &"})
	require.Eventually(t, func() bool { _, err := os.Stat(drained); return err == nil }, 10*time.Second, 10*time.Millisecond)

	// Once the children are gone (a destroyed session's are killed), every
	// drained pipe is closed.
	h.killAll()
	require.Eventually(t, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.lingering) == 0
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return openFDs(t) <= base }, 10*time.Second, 10*time.Millisecond)
}
