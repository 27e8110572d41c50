package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each session's PID 1 is the small session init shipped next to the
// daemon (cmd/sandbox-sessinit), never the daemon binary, and it runs
// under the session's own seccomp filter (one more than the daemon's,
// loaded from the daemon's precompiled program) with no_new_privs — also
// after a session that replaced the binaries in its own root was started
// again over its upper dir by a container restart.
func TestSessionInitIsTheSmallFilteredInit(t *testing.T) {
	// No warm sessions: they run the same init, and this test counts the
	// inits of the two sessions it made.
	sb := startSandboxWith(t, images[0], baseTree(), nil, []string{"--warm-sessions", "0"})
	a, b := sb.session(nil), sb.session(map[string]any{"network_profile": "isolated"})
	check := func(when string) {
		t.Helper()
		// From the sandbox: the inits are the processes running sandbox-sessinit.
		out := docker(t, "exec", sb.name, "sh", "-c", `
			grep Seccomp_filters /proc/1/status
			for p in /proc/[0-9]*; do
				case "$(readlink $p/exe)" in */sandbox-sessinit) echo "init $(grep -E '^(Seccomp_filters|NoNewPrivs)' $p/status | tr -s '\t\n' '  ') $(grep -E '^Anonymous' $p/smaps_rollup | tr -s ' ')";; esac
			done`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		own, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(lines[0], "Seccomp_filters:")))
		require.NoError(t, err, out)
		inits := lines[1:]
		require.Len(t, inits, 2, "%s: one small init per session: %s", when, out)
		for _, l := range inits {
			require.Contains(t, l, "Seccomp_filters: "+strconv.Itoa(own+1)+" ", "%s: %s", when, l)
			require.Contains(t, l, "NoNewPrivs: 1", "%s: %s", when, l)
		}
		t.Logf("%s: daemon under %d filters; %v", when, own, inits)
		// And what the sessions see: their commands are filtered too.
		for _, ws := range []string{a, b} {
			o := sb.exec(ws, "unshare -U true 2>&1 && echo UNSHARED; grep -c . /proc/self/status >/dev/null && echo ok")
			require.NotContains(t, o["output"], "UNSHARED")
			require.Contains(t, o["output"], "ok")
		}
	}
	check("fresh")
	// A session replaces the init and the daemon binary in its own root
	// (its writes land in its private upper dir) with an unfiltered stand-in.
	out := sb.exec(a, "for f in /usr/local/lib/eos/sandbox-sessinit /usr/local/lib/eos/sandbox-daemon; do "+
		"printf '#!/bin/sh\\nexec sleep 100000\\n' > $f && chmod 755 $f && echo replaced $f; done")
	require.Contains(t, out["output"], "replaced /usr/local/lib/eos/sandbox-sessinit", "%v", out)
	// A container restart starts every session again over its upper dir:
	// the daemon starts the init from its own files, not the session's.
	docker(t, "restart", "-t", "5", sb.name)
	sb.connect()
	check("after a container restart")
}
