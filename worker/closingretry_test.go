package worker

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"google.golang.org/grpc"
)

// TestClosingRetry: an update the server turned away because its run was
// continuing as new is sent again at once, a few times; other errors and
// other methods go straight to the SDK's own retry.
func TestClosingRetry(t *testing.T) {
	closing := serviceerror.NewResourceExhausted(enumspb.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW, "workflow operation can not be applied because workflow is closing")
	other := serviceerror.NewResourceExhausted(enumspb.RESOURCE_EXHAUSTED_CAUSE_RPS_LIMIT, "rps")
	const update = "/temporal.api.workflowservice.v1.WorkflowService/UpdateWorkflowExecution"
	calls := func(method string, errs ...error) (int, error) {
		n := 0
		err := closingRetry(context.Background(), method, nil, nil, nil, func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			n++
			if n <= len(errs) {
				return errs[n-1]
			}
			return nil
		})
		return n, err
	}
	n, err := calls(update, closing, closing)
	require.NoError(t, err)
	require.Equal(t, 3, n, "sent again until the next run took it")

	n, err = calls(update, other)
	require.Equal(t, other, err)
	require.Equal(t, 1, n, "another refusal is the SDK's to retry")

	n, err = calls("/temporal.api.workflowservice.v1.WorkflowService/SignalWorkflowExecution", closing)
	require.Equal(t, closing, err)
	require.Equal(t, 1, n, "only updates")

	many := make([]error, 20)
	for i := range many {
		many[i] = closing
	}
	n, err = calls(update, many...)
	require.Equal(t, closing, err)
	require.Equal(t, closingRetries+1, n, "then the SDK's slower retry takes over")
}
