package workflows

import (
	"encoding/json"
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// versionLocalFirst marks runs in which a session create and a publish
// call the daemon in a local activity first (localCall); runs recorded
// before replay their regular activities.
const versionLocalFirst = "daemon-call-local-first"

// versionDestroyLocalFirst marks runs in which a session destroy calls the
// daemon locally first too (a run recorded before it replays a regular
// activity, even where it recorded versionLocalFirst).
const versionDestroyLocalFirst = "destroy-local-first"

// ErrTypeNotHere is the error type of a local daemon call that ran on a
// worker of another host than the sandbox's.
const ErrTypeNotHere = "not_here"

// localCallTimeout bounds op's local daemon call (and names the version
// change that brought it), or is 0 when op is not called locally first:
// the calls on every agent's path, its session's create, its publish and
// its session's destroy, each safe to call twice (a create and a publish
// by a key the workflow derives; a destroy by its effect). The workflow task that carries the update stays
// open while a local call runs (the sandbox's other updates wait for it),
// so a call that takes longer goes on as a regular activity, and the
// second call joins, replays or completes the first: a
// publish, which the daemon finishes whatever its caller does, after
// 500 ms (a big change set); a create, which stops with its caller, after
// 2 s (its usual 30-40 ms grow to seconds only under heavy load).
// A destroy, which the daemon finishes whatever its caller does too, and
// which a second call answers as done (destroySession), after 2 s.
func localCallTimeout(op string) (time.Duration, string) {
	switch op {
	case UpdatePublish:
		return 500 * time.Millisecond, versionLocalFirst
	case "create_workspace_session":
		return 2 * time.Second, versionLocalFirst
	case "destroy_workspace_session":
		return 2 * time.Second, versionDestroyLocalFirst
	}
	return 0, ""
}

// callDaemon runs call: for the local-first ops, a local activity in this
// workflow task (no activity task, no second workflow task: about half the
// Temporal work per update, measured), falling back to CallDaemon on the
// host queue (actx's options) when the local call ran on another host,
// could not reach the daemon, or took longer than localCallTimeout. An
// answer of the daemon (a refusal, a conflict) is the answer either way.
//
// A gateway killed with its embedded Temporal while the local call runs
// loses the update (Temporal records its acceptance with the workflow
// task): the caller's connection breaks, and what the daemon does is
// still exactly once — the publish commits (the daemon finishes an
// exactly-once publish whatever its caller does) and a retry, under the
// same txid since the workflow's publish sequence did not move, answers
// its result; a session created then is the daemon's and listed by it.
func (s *sandbox) callDaemon(ctx, actx workflow.Context, call DaemonCall, out *json.RawMessage) error {
	if timeout, change := localCallTimeout(call.Op); timeout > 0 && workflow.GetVersion(ctx, change, workflow.DefaultVersion, 1) != workflow.DefaultVersion {
		call.HostQueue = s.in.HostQueue
		lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			ScheduleToCloseTimeout: timeout,
			RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		err := workflow.ExecuteLocalActivity(lctx, ActCallDaemonHere, call).Get(ctx, out)
		if err == nil || isDaemonAnswer(err) {
			return err
		}
		s.log.Info("the local daemon call goes on as an activity", "op", call.Op, "error", err)
	}
	return workflow.ExecuteActivity(actx, ActCallDaemon, call).Get(ctx, out)
}

// isDaemonAnswer is whether err is the daemon's own refusal (a
// non-retryable application error other than not_here), which a second
// call would only repeat.
func isDaemonAnswer(err error) bool {
	var ae *temporal.ApplicationError
	return errors.As(err, &ae) && ae.NonRetryable() && ae.Type() != ErrTypeNotHere
}
