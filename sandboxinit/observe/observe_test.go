package observe

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// fakeSource is a daemon without a layer stack whose sessions are not
// running: enough for the views that read only sessions and the
// telemetry store.
type fakeSource struct{ sessions []Session }

func (f fakeSource) Sessions() []Session { return f.sessions }
func (f fakeSource) Session(id string) (Session, error) {
	for _, s := range f.sessions {
		if s.ID == id {
			return s, nil
		}
	}
	return Session{}, api.Errorf(api.KindNotFound, nil, "workspace session not found: %s", id)
}
func (fakeSource) Layers() *layerstack.Store { return nil }

func newObserver(t *testing.T, sessions ...Session) *Observer {
	t.Helper()
	o, err := Open(Config{StateDir: t.TempDir(), SandboxID: "eos-test"}, fakeSource{sessions})
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// asJSON is v as a client of the RPC decodes it.
func asJSON(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// TestTopologyFromSource: the topology lists the sessions Source gives,
// sorted by id whatever their age (the seed's order), with the commands running in them; a session that is not
// running is partial and says so.
func TestTopologyFromSource(t *testing.T) {
	now := time.Now()
	o := newObserver(t, Session{ID: "ws-new", Created: now}, Session{ID: "ws-old", Created: now.Add(-time.Minute)}, Session{ID: "ws-mid", Created: now.Add(-time.Second)})
	x := &Execution{Workspace: "ws-old", Cmd: "sleep 1", Started: now}
	o.Running.Add(x)
	defer o.Running.Remove(x)

	top := asJSON(t, o.TopologyView())["topology"].(map[string]any)
	var ids, states []any
	for _, w := range top["workspaces"].([]any) {
		ids = append(ids, w.(map[string]any)["workspace_id"])
		states = append(states, w.(map[string]any)["state"])
	}
	require.Equal(t, []any{"ws-mid", "ws-new", "ws-old"}, ids, "sorted by id")
	require.Equal(t, []any{"partial", "partial", "partial"}, states)
	require.Equal(t, []any{"ws-mid: session is not running", "ws-new: session is not running", "ws-old: session is not running"}, top["warnings"])

	_, err := o.CgroupView(CgroupArgs{Scope: "ws-gone"})
	require.Equal(t, api.KindNotFound, api.AsError(err).Kind, "a scope that is no live session")
	cg, err := o.CgroupView(CgroupArgs{Scope: "ws-old"})
	require.NoError(t, err)
	require.Len(t, asJSON(t, cg)["topology"].(map[string]any)["workspaces"], 1, "only the scope's workspace")
}
