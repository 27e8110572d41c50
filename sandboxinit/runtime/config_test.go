package runtime

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestBuildConfig(t *testing.T) {
	cs := containerSpec{
		id: "s1", rootfs: "/eos/sessions/s1/root/merged", workspace: "/eos/ws/s1",
		hiddenDirs: []string{"/eos"}, hiddenFiles: []string{"/etc/daemon.token"},
		limits: Limits{MemoryBytes: 256 << 20, CPUs: 2}, swap: true,
	}
	cfg := buildConfig(cs)

	require.True(t, cfg.NoNewPrivileges)
	require.NotContains(t, cfg.Capabilities.Bounding, "CAP_SYS_ADMIN")
	require.NotContains(t, cfg.Capabilities.Bounding, "CAP_NET_ADMIN")
	require.Len(t, cfg.Capabilities.Bounding, 14)
	require.Equal(t, cfg.Capabilities.Bounding, cfg.Capabilities.Effective)
	require.Empty(t, cfg.Capabilities.Ambient)

	require.Equal(t, "sessions", cfg.Cgroups.Parent, "relative parent: resolves under the daemon's cgroup")
	require.Empty(t, cfg.Cgroups.Path)
	require.Equal(t, int64(DefaultPidsMax), *cfg.Cgroups.Resources.PidsLimit)
	require.Equal(t, int64(256<<20), cfg.Cgroups.Resources.Memory)
	require.Equal(t, int64(256<<20), cfg.Cgroups.Resources.MemorySwap)
	require.Equal(t, int64(200000), cfg.Cgroups.Resources.CpuQuota)
	require.NotEmpty(t, cfg.Cgroups.Resources.Devices)

	mounts := map[string]int{}
	for i, m := range cfg.Mounts {
		mounts[m.Destination] = i
	}
	for _, d := range []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/run", "/tmp", "/workspace", "/eos"} {
		require.Contains(t, mounts, d)
	}
	ws := cfg.Mounts[mounts["/workspace"]]
	require.Equal(t, cs.workspace, ws.Source)
	require.Equal(t, []int{unix.MS_SLAVE | unix.MS_REC}, ws.PropagationFlags, "a slave: the overlay mounted on the workspace after the start reaches the session")
	hidden := cfg.Mounts[mounts["/eos"]]
	require.Equal(t, "tmpfs", hidden.Device)
	require.NotZero(t, hidden.Flags&unix.MS_RDONLY)
	require.Contains(t, hidden.Data, "mode=000")
	require.NotZero(t, cfg.Mounts[mounts["/sys"]].Flags&unix.MS_RDONLY)
	require.Contains(t, cfg.MaskPaths, "/etc/daemon.token")
	require.Contains(t, cfg.MaskPaths, "/proc/kcore")
	require.Contains(t, cfg.ReadonlyPaths, "/proc/sys")

	require.False(t, cfg.Namespaces.Contains("NEWNET"))
	require.Empty(t, cfg.NetDevices)
	require.Empty(t, cfg.Routes)
}

func TestBuildConfigIsolated(t *testing.T) {
	cfg := buildConfig(containerSpec{
		id: "s2", rootfs: "/r", workspace: "/w",
		net: &netSpec{peer: "eoc-s2", addr: "10.200.0.6", gateway: "10.200.0.5"},
	})
	var types []string
	for _, ns := range cfg.Namespaces {
		types = append(types, string(ns.Type))
	}
	require.True(t, slices.Contains(types, "NEWNET"))
	require.Equal(t, "eth0", cfg.NetDevices["eoc-s2"].Name)
	require.Len(t, cfg.Routes, 1)
	require.Equal(t, "10.200.0.5", cfg.Routes[0].Gateway)
	require.Equal(t, "loopback", cfg.Networks[0].Type)
	require.Zero(t, cfg.Cgroups.Resources.Memory)
	require.Zero(t, cfg.Cgroups.Resources.CpuQuota)
}

func TestMissingCaps(t *testing.T) {
	status := "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t00000000a80425fb\n"
	mask, err := parseCapEff(status)
	require.NoError(t, err)
	require.Equal(t, uint64(0xa80425fb), mask)
	missing := missingCaps(mask, requiredCaps)
	require.Equal(t, []string{"SYS_ADMIN (mounts, namespaces, pivot_root, cgroup remount)"}, missing)
	require.Empty(t, missingCaps(mask, sessionCapBits), "Docker's default set is exactly what sessions keep")
	_, err = parseCapEff("Name:\tx\n")
	require.Error(t, err)
}
