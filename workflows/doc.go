// Package workflows holds the durable lifecycle of sandboxes on Temporal:
// SandboxWorkflow, one entity per sandbox (id "sandbox/<id>"),
// PublishWorkflow, the child per publish of runs recorded before publishes
// became one call, and HostOpWorkflow, one read of a Docker host (images,
// directories, counters) run on that host's worker.
//
// The package declares the activities it runs (activity.go): their
// registered names and their input and output types. Package activities
// implements them; this package never imports it.
//
// Invariants:
//   - Deterministic code only: no I/O, clocks, randomness or map iteration
//     outside workflow APIs (workflowcheck runs over this package in CI).
//   - Creation is a saga: every Docker object created is compensated in
//     reverse order when a later step fails, so a failed create leaves no
//     container, volume or running workflow behind.
//   - Everything that commits to a sandbox's layer stack (publish, amend,
//     refresh, squash) runs under one workflow mutex: commits are serialised
//     per sandbox.
//   - A publish is exactly once: one daemon call (publish_workspace_session
//     with exactly_once, versionPublishOneActivity) by its transaction id
//     publish/<sandbox>/<session>/<n>, which the daemon commits once and
//     answers the same however often it is retried (a regular activity on
//     the host's queue: the update is accepted durably in the workflow task
//     that schedules it, so a worker or server killed mid-publish loses
//     nothing). Verified publishes queue in workflow order
//     (publishVerified). In runs recorded before, the transaction id is
//     the child workflow's id, and every daemon step (prepare, commit, finalize) is idempotent by
//     that id, so retries and worker crashes at any step converge. A
//     publish that did not commit always ends with abort (also after a
//     failed prepare), and abort and finalize retry on a disconnected
//     context until the daemon answers (versionPublishSettles). A daemon
//     that restarted between prepare and commit aborts the publish at boot;
//     the workflow then starts over under a derived txid (at most
//     maxPublishRestarts times), so the publish still commits exactly once.
//   - Activity inputs and outputs never carry the daemon token: activities
//     derive it from the gateway secret and the sandbox id.
//   - Failures are the one wire error, *api.Error, raised with apperr and
//     returned unwrapped, so the gateway hands clients the refusal itself.
//   - A daemon answer that does not decode into its api type is an error.
//   - The state struct is the continue-as-new payload; the workflow
//     continues as new once Temporal suggests it and no handler is running.
//   - Lifecycle a user turns on (lifecycle_ttl.go) never deletes: a TTL
//     pauses the sandbox (its container stopped, every volume kept), and an
//     idle session is archived with its work and its base. A pause waits for
//     the updates accepted before it and is refused while a publish runs; a
//     paused sandbox refuses runtime updates with failed_precondition. A
//     failed resume stops the container again: a sandbox is running or
//     paused, never in between, after any crash (the stop and start
//     activities are idempotent and retried).
package workflows
