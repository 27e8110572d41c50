package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestRecordSharedBase: sandboxes created together report the seed's
// shared_base with the one root_hash of their base; others report null.
func TestRecordSharedBase(t *testing.T) {
	b := &TemporalBackend{}
	memo := map[string]any{"workspace_root": "/src/app"}
	for _, id := range []string{"eos-1", "eos-2"} {
		rec := b.recordWith(&workflows.SandboxState{SandboxID: id, Phase: workflows.PhaseReady, SharedRootHash: "r00t"}, memo)
		require.Equal(t, map[string]any{"source": "/src/app", "target": "/workspace", "root_hash": "r00t", "readonly": true}, rec["shared_base"])
	}
	rec := b.recordWith(&workflows.SandboxState{SandboxID: "eos-3", Phase: workflows.PhaseReady}, memo)
	require.Nil(t, rec["shared_base"])
}
