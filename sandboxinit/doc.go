// Package sandboxinit is the runtime inside every sandbox container: the
// daemon behind cmd/sandbox-daemon. It owns the sandbox's layer stack on the
// state volume, the workspace sessions (libcontainer containers, see
// runtime/), the commands running in them (command/), file operations, and
// the HTTP/JSON RPC the gateway and the workers call.
//
// Invariants:
//   - PID 1 is a small supervisor (Supervise) that reaps orphans and restarts
//     the daemon; the daemon itself never reaps children it did not start.
//   - Every request carries the sandbox token (constant-time compare); bodies
//     are capped (16 MiB), concurrency is capped (server_busy), and the
//     request id is the trace id.
//   - A session's record, lease and upper dir live on the state volume and are
//     saved before anything that depends on them, so a daemon or container
//     restart brings every session back with its unpublished work.
//   - The daemon touches a session's files only through descriptors opened
//     beneath its merged or upper dir (layerstack.Dir: openat2 with
//     RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, regular files checked by fstat on
//     the inode that is read): file ops refuse any path through a symlink
//     (invalid_request), walks never enter one, and a capture (publish, diff,
//     check, refresh) runs with the session's processes frozen and thaws on
//     every path. Client errors name workspace paths, never the state
//     volume. Sessionless reads see the published head; sessionless writes
//     are one-layer commits.
//   - Publish, refresh and destroy take the session's gate and refuse while
//     commands run (listing them); commands are not admitted while a publish
//     is prepared. Every publish step is idempotent by its transaction id and
//     answers a retry with its first answer; the steps of one transaction
//     never run at once.
//   - No session stays "publishing" without a way out: only a clean dry run
//     leaves a prepared record (record first, then the state); aborting a
//     txid never prepared is a no-op that refuses a late prepare of it; at
//     boot every unfinished publish is finalized when its commit is recorded
//     (by the daemon or the store) and aborted otherwise (aborted_by
//     daemon_restart, so its workflow may start it over); and
//     recover_workspace_session settles a session's publishes and brings it
//     back to active over its upper dir.
//   - A call on a session destroyed meanwhile answers not_found; error
//     messages name workspace paths, never the state volume's.
//   - An implicit session publishes inside its command's OnExit, so every
//     terminal response of the command carries the outcome, whichever call
//     returns it; a clean publish adds no publish_rejected key.
//   - The state volume and the token are masked in every session.
//   - Memory and counts are budgeted per sandbox (budget.go, Config):
//     max_sessions (256) live sessions, max_running_commands (512) running
//     commands, max_publish_bytes (1 GiB) of files in one change set, each
//     refused with resource_exhausted (HTTP 429) naming the limit in
//     details.limit and its value in details.max; a publish is refused
//     before anything is frozen. The output of all commands, running and
//     finished, holds at most output_budget_bytes (256 MiB) of memory
//     together (counted by what is allocated for it); past it the oldest
//     finished ones lose theirs first (reads say output_dropped), then the
//     running ones keep less, the largest cut first, down to their newest
//     lines (reads say truncated); no command is refused for it (command/
//     doc.go states the one floor). Output pipes that background children
//     hold after their command ended are drained, at most 256 of them: past
//     that the oldest is closed (its child gets EPIPE if it writes again).
//   - An isolated session's egress policy (default, none, or "cidr:port"
//     entries) is validated here, kept in its record and shown in its info
//     and the snapshot; the runtime enforces it. A shared session cannot
//     have one: it uses the sandbox's network.
//   - Observability (observe.go, telemetry/) is fail-open and bounded: the
//   - Observability (observe/, telemetry/) is fail-open and bounded: the
//     views are served under a quiet context and never write or count as
//     activity; every other request is a daemon.dispatch span, wakes the
//     sampler, and records its events in its trace. The sampler runs only
//     while commands run or requests came recently.
package sandboxinit
