package main

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
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

// TestStartupInitStaysSmall: this binary is re-executed as runc init for
// every session start (and every libcontainer exec), and each time Go runs
// every linked package's initialisation first. A dependency that compiles
// a grammar at init (github.com/distribution/reference: 414 KB in 3,600
// allocations, 1.2 ms of each session start) belongs in the processes
// that need it, not here. The budget is on what the packages this binary
// links allocate at init (GODEBUG=inittrace, deterministic), not on time.
var initLine = regexp.MustCompile(`^init (\S+) @.* ms clock, (\d+) bytes, \d+ allocs$`)

func TestStartupInitStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	require.NoError(t, err)
	linked := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		linked[p] = true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	trace, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", trace)
	const budget = 512 << 10
	total, largest := 0, map[string]int{}
	for _, line := range strings.Split(string(trace), "\n") {
		m := initLine.FindStringSubmatch(line)
		if m == nil || !linked[m[1]] {
			continue
		}
		b, err := strconv.Atoi(m[2])
		require.NoError(t, err, line)
		total += b
		if b > 64<<10 {
			largest[m[1]] = b
		}
	}
	require.NotZero(t, total, "no init trace read:\n%s", trace)
	require.LessOrEqual(t, total, budget, "the daemon's packages allocate %d bytes at init (budget %d); the largest: %v", total, budget, largest)
}
