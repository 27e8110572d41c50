package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestEveryRecordsOpHasAHandler: the catalog says how each lifecycle op is
// served; every op the gateway answers itself has its handler, and no
// handler serves an op the catalog routes elsewhere.
func TestEveryRecordsOpHasAHandler(t *testing.T) {
	want := map[string]bool{}
	for _, o := range api.PublicOps("") {
		if o.Lifecycle && o.Route == api.RouteRecords {
			want[o.Name] = true
			require.Contains(t, recordHandlers, o.Name, "no record handler for %s", o.Name)
		}
	}
	for name := range recordHandlers {
		require.True(t, want[name], "record handler %s serves an op the catalog does not route to the records", name)
	}
}

// TestUpdateOpsAreWorkflowUpdates: an op of RouteUpdate is the sandbox
// workflow's update of the same name (the workflow registers it).
func TestUpdateOpsAreWorkflowUpdates(t *testing.T) {
	updates := map[string]bool{workflows.UpdateCreateSession: true, workflows.UpdateDestroySession: true, workflows.UpdatePublish: true,
		workflows.UpdateRefresh: true, workflows.UpdateSquash: true, workflows.UpdateExport: true,
		workflows.UpdatePause: true, workflows.UpdateResume: true, workflows.UpdateRestoreSession: true}
	for _, o := range api.PublicOps("") {
		if o.Lifecycle && o.Route == api.RouteUpdate {
			require.True(t, updates[o.Name], "%s is routed to a workflow update the sandbox workflow does not have", o.Name)
		}
	}
}
