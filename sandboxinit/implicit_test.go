package sandboxinit

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// What an implicit session's publish adds to its command's responses.
func TestImplicitOutcome(t *testing.T) {
	conflict := &layerstack.ConflictError{Conflicts: []layerstack.Conflict{{Path: "f.txt", Reason: layerstack.ReasonProtectedPath, Kind: "protected"}}}
	for _, tc := range []struct {
		name      string
		res       map[string]any
		err       error
		class     string // "" = a clean publish
		conflicts int
	}{
		{name: "clean", res: map[string]any{"publish": map[string]any{"no_op": false}}},
		{name: "rejected", err: &publishRejected{wire: api.Errorf(api.KindOperationFailed, nil, "publish rejected"), conflict: conflict},
			class: layerstack.ReasonProtectedPath, conflicts: 1},
		{name: "failed", err: errors.New("disk full"), class: "publish_failed"},
		{name: "session destroyed", err: errSessionNotFound("ws-1"), class: "session_destroyed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := &api.CommandOutput{Status: api.StatusOK}
			implicitOutcome(tc.res, tc.err)(out)
			b, err := json.Marshal(out)
			require.NoError(t, err)
			var wire map[string]any
			require.NoError(t, json.Unmarshal(b, &wire))
			if tc.class == "" {
				require.NotContains(t, wire, "publish_rejected", "a clean run carries no publish_rejected key")
				require.NotNil(t, out.Publish)
				return
			}
			require.Equal(t, true, wire["publish_rejected"])
			require.Equal(t, tc.class, wire["publish_reject_class"])
			require.Len(t, out.PublishConflicts, tc.conflicts)
		})
	}
}
