package observe

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// fakeSource is a daemon without sessions or a layer stack: enough for the
// views that read only the telemetry store.
type fakeSource struct{}

func (fakeSource) Sessions() []Session { return nil }
func (fakeSource) Session(id string) (Session, error) {
	return Session{}, api.Errorf(api.KindNotFound, nil, "workspace session not found: %s", id)
}
func (fakeSource) Layers() *layerstack.Store { return nil }

func newObserver(t *testing.T) *Observer {
	t.Helper()
	o, err := Open(Config{StateDir: t.TempDir(), SandboxID: "eos-test"}, fakeSource{})
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
