package worker

import (
	"context"
	"errors"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// closingRetry sends an update again, at once, that the server turned away
// because the run it reached was continuing as new: the server aborts
// updates admitted to a closing run with a retryable error (ResourceExhausted,
// cause BUSY_WORKFLOW) so that the next attempt reaches the next run. The
// SDK's own retry waits 200 ms and then 400 ms for a hand-over that takes
// a few milliseconds (a quiet sandbox workflow continues as new about
// every hundred updates). It sits inside the SDK's retry: after closingRetries
// quick attempts (about 130 ms) the error goes on to it.
func closingRetry(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasSuffix(method, "/UpdateWorkflowExecution") {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	wait := 2 * time.Millisecond
	for i := 0; ; i++ {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if i == closingRetries || !workflowClosing(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

const closingRetries = 6

// workflowClosing: the server's "workflow is closing" refusal (it also
// says BUSY_WORKFLOW when a run has too many updates in flight; a few quick
// attempts then cost little before the SDK's slower retry).
func workflowClosing(err error) bool {
	if err == nil {
		return false
	}
	var re *serviceerror.ResourceExhausted
	if !errors.As(err, &re) && !errors.As(serviceerror.FromStatus(status.Convert(err)), &re) {
		return false
	}
	return re.Cause == enumspb.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW
}
