package runtime

import (
	"math"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func validSpec() SessionSpec {
	return SessionSpec{
		ID: "s-1", Dir: "/eos/sessions/s-1", Workspace: "/eos/ws/s-1",
		InitPath: "/usr/local/bin/sandbox-daemon", InitArgs: []string{"sessinit"},
		Hidden: []string{"/eos"},
	}
}

func TestSessionSpecValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*SessionSpec)
		wantErr string
	}{
		{"valid", func(*SessionSpec) {}, ""},
		{"valid isolated with addr", func(s *SessionSpec) { s.Isolated, s.Addr = true, "10.200.0.6" }, ""},
		{"id upper case", func(s *SessionSpec) { s.ID = "Abc" }, "does not match"},
		{"id too long", func(s *SessionSpec) { s.ID = strings.Repeat("a", 65) }, "does not match"},
		{"id empty", func(s *SessionSpec) { s.ID = "" }, "does not match"},
		{"relative dir", func(s *SessionSpec) { s.Dir = "eos/x" }, "clean absolute"},
		{"unclean workspace", func(s *SessionSpec) { s.Workspace = "/eos/../ws" }, "clean absolute"},
		{"comma in dir", func(s *SessionSpec) { s.Dir = "/eos/a,b" }, "overlay options"},
		{"hide root", func(s *SessionSpec) { s.Hidden = []string{"/"} }, "other than /"},
		{"hide proc", func(s *SessionSpec) { s.Hidden = []string{"/proc/sys"} }, "overlaps"},
		{"hide workspace", func(s *SessionSpec) { s.Hidden = []string{"/workspace"} }, "overlaps"},
		{"hide procfoo is fine", func(s *SessionSpec) { s.Hidden = []string{"/procfoo"} }, ""},
		{"init under hidden", func(s *SessionSpec) { s.InitPath = "/eos/bin/daemon" }, "under hidden"},
		{"negative limit", func(s *SessionSpec) { s.Limits.CPUs = -1 }, "negative"},
		{"tiny memory", func(s *SessionSpec) { s.Limits.MemoryBytes = 1 << 20 }, "below 8 MiB"},
		{"negative pids", func(s *SessionSpec) { s.Limits.PidsMax = -1 }, "pids_max must not be negative"},
		{"pids above the kernel's", func(s *SessionSpec) { s.Limits.PidsMax = MaxPidsMax + 1 }, "pids_max must be at most 4194304"},
		{"huge cpus", func(s *SessionSpec) { s.Limits.CPUs = 1e300 }, "cpus must be at most 1024"},
		{"infinite cpus", func(s *SessionSpec) { s.Limits.CPUs = math.Inf(1) }, "cpus must be a finite number"},
		{"nan cpus", func(s *SessionSpec) { s.Limits.CPUs = math.NaN() }, "cpus must be a finite number"},
		{"the largest limits", func(s *SessionSpec) {
			s.Limits = Limits{PidsMax: MaxPidsMax, MemoryBytes: math.MaxInt64, CPUs: MaxCPUs}
		}, ""},
		{"addr without isolation", func(s *SessionSpec) { s.Addr = "10.200.0.6" }, "shared-network"},
		{"addr outside pool", func(s *SessionSpec) { s.Isolated, s.Addr = true, "10.201.0.6" }, "not in"},
		{"addr is a gateway", func(s *SessionSpec) { s.Isolated, s.Addr = true, "10.200.0.5" }, "session address"},
		{"egress none isolated", func(s *SessionSpec) { s.Isolated, s.Egress = true, Egress{None: true} }, ""},
		{"egress allow isolated", func(s *SessionSpec) {
			s.Isolated, s.Egress = true, Egress{Allow: []EgressRule{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Port: 443}}}
		}, ""},
		{"egress on a shared session", func(s *SessionSpec) { s.Egress = Egress{None: true} }, "needs an isolated session"},
		{"egress none and allow", func(s *SessionSpec) {
			s.Isolated, s.Egress = true, Egress{None: true, Allow: []EgressRule{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Port: 443}}}
		}, "none with an allow-list"},
		{"egress port 0", func(s *SessionSpec) {
			s.Isolated, s.Egress = true, Egress{Allow: []EgressRule{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}
		}, "want an IPv4 prefix and a port"},
		{"egress ipv6", func(s *SessionSpec) {
			s.Isolated, s.Egress = true, Egress{Allow: []EgressRule{{Prefix: netip.MustParsePrefix("::/0"), Port: 1}}}
		}, "want an IPv4 prefix and a port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSpec()
			tt.edit(&s)
			err := s.validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidSpec)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestLimits(t *testing.T) {
	tests := []struct {
		lim    Limits
		pids   int64
		quota  int64
		period uint64
	}{
		{Limits{}, DefaultPidsMax, 0, 0},
		{Limits{PidsMax: 64, CPUs: 1.5}, 64, 150000, 100000},
		{Limits{CPUs: 0.001}, DefaultPidsMax, 1000, 100000},
		{Limits{CPUs: MaxCPUs}, DefaultPidsMax, MaxCPUs * 100000, 100000},
	}
	for _, tt := range tests {
		q, p := tt.lim.cfsQuota()
		require.Equal(t, tt.pids, tt.lim.pidsMax())
		require.Equal(t, tt.quota, q)
		require.Equal(t, tt.period, p)
	}
}

func TestSubnets(t *testing.T) {
	tests := []struct {
		index            int
		gateway, session string
	}{
		{1, "10.200.0.5", "10.200.0.6"},
		{63, "10.200.0.253", "10.200.0.254"},
		{64, "10.200.1.1", "10.200.1.2"},
		{subnetCount - 1, "10.200.255.253", "10.200.255.254"},
	}
	for _, tt := range tests {
		sn := subnet{index: tt.index}
		require.Equal(t, tt.gateway, sn.gateway().String())
		require.Equal(t, tt.session, sn.session().String())
		back, err := subnetOf(tt.session)
		require.NoError(t, err)
		require.Equal(t, sn, back)
	}
}

func TestPickSubnet(t *testing.T) {
	first, err := pickSubnet("abc", nil, map[int]bool{})
	require.NoError(t, err)
	require.NotZero(t, first.index)
	again, err := pickSubnet("abc", nil, map[int]bool{})
	require.NoError(t, err)
	require.Equal(t, first, again, "an id keeps its subnet while it is free")

	next, err := pickSubnet("abc", nil, map[int]bool{first.index: true})
	require.NoError(t, err)
	require.NotEqual(t, first, next)

	want := subnet{index: 7}
	got, err := pickSubnet("abc", &want, map[int]bool{})
	require.NoError(t, err)
	require.Equal(t, want, got)
	_, err = pickSubnet("abc", &want, map[int]bool{7: true})
	require.ErrorContains(t, err, "in use")

	all := map[int]bool{}
	for i := range subnetCount {
		all[i] = true
	}
	_, err = pickSubnet("abc", nil, all)
	require.ErrorContains(t, err, "no free")
}

func TestLinkNames(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"a", "session-12", "session-123", "session-124", strings.Repeat("x", 64), strings.Repeat("x", 63) + "y"} {
		host, peer := linkNames(id)
		require.LessOrEqual(t, len(host), 15, host)
		require.LessOrEqual(t, len(peer), 15, peer)
		require.True(t, strings.HasPrefix(host, "eos-"))
		require.NotContains(t, seen, host, "ids %q and %q collide", id, seen[host])
		seen[host] = id
	}
	host, _ := linkNames("web-1")
	require.Equal(t, "eos-web-1", host, "short ids stay readable")
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv(defaultEnv, []string{"HOME=/home/x", "A=1"}, []string{"A=2", "B"})
	require.Equal(t, []string{defaultEnv[0], "HOME=/home/x", "A=2", "B"}, got)
	require.True(t, hasEnv(got, "HOME"))
	require.False(t, hasEnv(got, "HOM"))
}
