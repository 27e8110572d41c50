package sandboxinit

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// TestSessionLimitsRefusedUpFront: limits the runtime cannot apply as
// asked are invalid_request naming the field (details.arg), for a new
// session and a fork, before any lease, directory or runtime work.
func TestSessionLimitsRefusedUpFront(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	for _, tc := range []struct {
		name   string
		limits api.SessionLimits
		arg    string
	}{
		{"negative pids", api.SessionLimits{PidsMax: -1}, "limits.pids_max"},
		{"pids above the kernel's", api.SessionLimits{PidsMax: 1 << 40}, "limits.pids_max"},
		{"tiny memory", api.SessionLimits{MemoryBytes: 5}, "limits.memory_bytes"},
		{"negative memory", api.SessionLimits{MemoryBytes: -1}, "limits.memory_bytes"},
		{"cpus that overflow the quota", api.SessionLimits{CPUs: 1e300}, "limits.cpus"},
		{"infinite cpus", api.SessionLimits{CPUs: math.Inf(1)}, "limits.cpus"},
		{"nan cpus", api.SessionLimits{CPUs: math.NaN()}, "limits.cpus"},
		{"negative cpus", api.SessionLimits{CPUs: -0.5}, "limits.cpus"},
		{"cpus above the maximum", api.SessionLimits{CPUs: 1024.5}, "limits.cpus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, create := range []func(api.CreateSessionArgs) (*session, error){
				func(a api.CreateSessionArgs) (*session, error) { return d.createSession(ctx, a, false) },
				func(a api.CreateSessionArgs) (*session, error) { a.From = "ws-absent"; return d.forkSession(ctx, a) },
			} {
				_, err := create(api.CreateSessionArgs{Limits: &tc.limits})
				e := requireKind(t, err, api.KindInvalidRequest)
				require.Equal(t, tc.arg, e.Details["arg"], "%v", e)
				require.Contains(t, e.Message, tc.arg)
			}
			ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "sessions"))
			require.NoError(t, err)
			require.Empty(t, ents, "no session dir made")
			require.Empty(t, d.store.Leases(), "no lease taken")
		})
	}
}

// TestCatalogRefusesTheDaemonsLimits: the catalog's schema of limits holds
// the daemon's bounds, so the gateway refuses a bad value (details.arg
// naming it) before it reaches the daemon, and lets the largest and
// smallest good ones through.
func TestCatalogRefusesTheDaemonsLimits(t *testing.T) {
	op, ok := api.LookupOp("create_workspace_session")
	require.True(t, ok)
	validate := func(limits string) *api.Error {
		dec := json.NewDecoder(strings.NewReader(`{"limits":` + limits + `}`))
		dec.UseNumber() // as the HTTP door decodes
		var args map[string]any
		require.NoError(t, dec.Decode(&args))
		return op.Validate(args)
	}
	for limits, arg := range map[string]string{
		`{"pids_max":-1}`:             "limits.pids_max",
		`{"pids_max":4194305}`:        "limits.pids_max",
		`{"pids_max":1.5}`:            "limits.pids_max",
		`{"memory_bytes":5}`:          "limits.memory_bytes",
		`{"memory_bytes":-1}`:         "limits.memory_bytes",
		`{"cpus":1e300}`:              "limits.cpus",
		`{"cpus":1e400}`:              "limits.cpus",
		`{"cpus":0}`:                  "limits.cpus",
		`{"cpus":-0.5}`:               "limits.cpus",
		`{"cpus":"2"}`:                "limits.cpus",
		`{"cpu":2}`:                   "limits.cpu",
		`{"pids_max":64,"cpus":2000}`: "limits.cpus",
	} {
		e := validate(limits)
		require.NotNil(t, e, limits)
		require.Equal(t, api.KindInvalidRequest, e.Kind)
		require.Equal(t, arg, e.Details["arg"], "%s: %v", limits, e)
	}
	for _, limits := range []string{`{}`, `{"pids_max":1,"memory_bytes":8388608,"cpus":0.01}`, `{"pids_max":4194304,"memory_bytes":1099511627776,"cpus":1024}`} {
		require.Nil(t, validate(limits), limits)
		var l api.SessionLimits
		require.NoError(t, json.Unmarshal([]byte(limits), &l))
		_, err := limitsOf(&l)
		require.NoError(t, err, "the daemon takes what the catalog lets through: %s", limits)
	}
}
