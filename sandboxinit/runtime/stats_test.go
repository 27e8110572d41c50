package runtime

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The test process's own cgroup stands in for a sandbox's: reading it
// touches nothing.
func TestReadCgroupUsage(t *testing.T) {
	paths, err := SandboxCgroupPaths()
	require.NoError(t, err, "this test reads its own cgroup under /sys/fs/cgroup (v1 or v2)")
	u, err := ReadCgroupUsage(paths)
	if err != nil {
		// On a host the test may sit in a root cgroup of some controller
		// (no pids.current there): the others are still read.
		require.ErrorIs(t, err, ErrPartialStats, "paths %v", paths)
	}
	require.Greater(t, u.CPUUsageUsec, uint64(0))
	require.Greater(t, u.MemoryBytes, uint64(0))
	_, err = ReadCgroupUsage(nil)
	require.Error(t, err)
}
