package workflows

import (
	"math"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// resolveWithin bounds a resolve_daemon's look at the container.
const resolveWithin = 30 * time.Second

// nonRetryable are activity error types that no retry can fix. Refusals
// raised with apperr.New are non-retryable themselves; these are the types
// older workers raised, for failures still in flight during an upgrade.
var nonRetryable = []string{"ImageNotFound", "InvalidArgument", "DaemonError", "NotFound"}

// dockerOptions: Docker calls on the sandbox's host. Each heartbeats every
// 2 s while it runs (activities' heartbeatEvery), so a worker killed in
// the middle of a create is noticed within 6 s and the step retried
// (every step is idempotent by the sandbox id), not after a 30 s wait.
func dockerOptions(ctx workflow.Context, hostQueue string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              hostQueue,
		ScheduleToCloseTimeout: 10 * time.Minute,
		StartToCloseTimeout:    5 * time.Minute,
		HeartbeatTimeout:       6 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, BackoffCoefficient: 2,
			MaximumInterval: 10 * time.Second, MaximumAttempts: 6, NonRetryableErrorTypes: nonRetryable},
	})
}

// daemonOptions: RPCs to the sandbox's daemon. They are idempotent by the
// request id the workflow derives, so retries are safe.
func daemonOptions(ctx workflow.Context, hostQueue string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              hostQueue,
		ScheduleToCloseTimeout: 15 * time.Minute,
		StartToCloseTimeout:    6 * time.Minute,
		// CallDaemon heartbeats every 2 s while it waits: a worker that dies
		// mid-call is noticed in seconds and the call is retried elsewhere.
		HeartbeatTimeout: 6 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2,
			MaximumInterval: 5 * time.Second, MaximumAttempts: 10, NonRetryableErrorTypes: nonRetryable},
	})
}

// settleOptions: publish_abort and publish_finalize, which end a prepared
// publish one way or the other. Until one of them ran, the session stays
// "publishing" and refuses its agent, so they retry with capped backoff,
// without an attempt limit, for as long as a daemon can plausibly be away
// (a container or host restart). A refusal (non-retryable) still ends them.
// The attempt count is explicit rather than 0 (unlimited) because the SDK's
// test environment turns 0 into 10, which would hide a policy that stops
// too early.
func settleOptions(ctx workflow.Context, hostQueue string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              hostQueue,
		ScheduleToCloseTimeout: 24 * time.Hour,
		StartToCloseTimeout:    6 * time.Minute,
		HeartbeatTimeout:       6 * time.Second, // as daemonOptions: CallDaemon heartbeats every 2 s
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2,
			MaximumInterval: 30 * time.Second, MaximumAttempts: math.MaxInt32, NonRetryableErrorTypes: nonRetryable},
	})
}

// cleanupOptions: compensations and destroy retry longer; they must finish.
func cleanupOptions(ctx workflow.Context, hostQueue string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              hostQueue,
		ScheduleToCloseTimeout: 30 * time.Minute,
		StartToCloseTimeout:    2 * time.Minute,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute},
	})
}

// resolveOptions: a quick look at the container; the caller waits for it,
// so it is bounded from when it is scheduled too: on a host whose worker
// is gone it would otherwise wait in that worker's queue until it is back.
func resolveOptions(ctx workflow.Context, hostQueue string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              hostQueue,
		ScheduleToCloseTimeout: resolveWithin,
		StartToCloseTimeout:    10 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumAttempts: 3},
	})
}

// verifyOptions: a verified publish's one daemon call, which runs for as
// long as its verifications may (budget). CallDaemon heartbeats every 2 s,
// so a worker that dies mid-call is noticed in seconds; the retry joins
// the daemon's call by its txid.
func verifyOptions(ctx workflow.Context, hostQueue string, budget time.Duration) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              hostQueue,
		ScheduleToCloseTimeout: 2*budget + 10*time.Minute,
		StartToCloseTimeout:    budget + time.Minute,
		HeartbeatTimeout:       6 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 2,
			MaximumInterval: 5 * time.Second, MaximumAttempts: 10, NonRetryableErrorTypes: nonRetryable},
	})
}
