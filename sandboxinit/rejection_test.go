package sandboxinit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// A conflict report is bounded whatever conflicted (it travels back through
// the sandbox workflow): thousands of conflicting files with long paths,
// or one file whose sides differ in millions of places, are listed up to
// api.MaxConflictReportBytes and the rest counted.
func TestConflictReportIsBounded(t *testing.T) {
	hunks := make([]layerstack.MergeConflict, layerstack.MaxConflictHunks)
	ce := &layerstack.ConflictError{Conflicts: []layerstack.Conflict{{Path: "big.txt", Kind: layerstack.ConflictContent,
		Reason: layerstack.ReasonSourceConflict, Message: "2000000 overlapping edit(s)", Hunks: hunks, HunksTotal: 2000000}}}
	for i := range 20000 {
		ce.Conflicts = append(ce.Conflicts, layerstack.Conflict{Path: fmt.Sprintf("d/%s/%05d.txt", strings.Repeat("x", 200), i),
			Kind: layerstack.ConflictBinary, Reason: layerstack.ReasonSourceConflict, Message: "a binary file changed on both sides",
			Base: "file:0644:" + strings.Repeat("a", 64), Head: "file:0644:" + strings.Repeat("b", 64), Ours: "file:0644:" + strings.Repeat("c", 64)})
	}
	r := rejection(ce)
	b, err := json.Marshal(r.Details(nil))
	require.NoError(t, err)
	require.Less(t, len(b), api.MaxConflictReportBytes*3/2, "the report takes %d bytes", len(b))
	require.Greater(t, len(r.Conflicts), 100, "what fits is listed")
	require.Equal(t, len(ce.Conflicts), len(r.Conflicts)+r.ConflictsOmitted)
	require.Equal(t, 2000000, len(r.Conflicts[0].Hunks)+r.Conflicts[0].HunksOmitted)
	require.NotNil(t, r.PublishRejection)

	small := rejection(&layerstack.ConflictError{Conflicts: ce.Conflicts[1:3]})
	require.Len(t, small.Conflicts, 2)
	require.Zero(t, small.ConflictsOmitted, "a small report is whole")
}
