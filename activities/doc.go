// Package activities holds the Temporal activities: every call to the Docker
// Engine and every RPC to a sandbox's daemon made on behalf of a workflow.
// Workflows reference them through a typed nil pointer
// (var a *activities.Activities; workflow.ExecuteActivity(ctx, a.CreateContainer, spec));
// the worker registers one *Activities built by New.
//
// # Idempotency
//
// Activities are retried, so each one is keyed by data from its input, never
// by anything it makes up:
//
//   - A sandbox's Docker objects have deterministic names, ContainerName and
//     VolumeName of the sandbox id. CreateVolume returns the volume an earlier
//     attempt made (a volume of that name without our labels is an ErrConflict:
//     it may hold someone's data). CreateContainer adopts a container of that
//     name that carries our labels for this sandbox and was created from the
//     same image id (ContainerInfo.Adopted), redoing the copy-in unless it runs;
//     any other container of that name is force-removed and recreated (Nomad's
//     create-or-adopt). StartContainer on a running container, StopContainer on
//     a stopped or missing one and RemoveSandbox on missing objects succeed.
//   - Daemon calls carry the workflow's request id (X-Request-Id); operations
//     with side effects take their own idempotency key in their args (the
//     publish steps' txid), which the daemon's store honours.
//   - CopyWorkspace and a "dir" export overwrite what an earlier attempt wrote.
//     "tar", "tar-zst" and "patch" exports refuse an existing destination, and
//     link the file into place only when complete, so a destination is either
//     a whole export or absent.
//
// Every object carries LabelManaged, LabelSandboxID, LabelRole and LabelWorker;
// ListLeftovers and RemoveLeftovers (the worker-start reconciler, callable
// without Temporal) find them by those labels, restricted to this worker's
// WorkerID when one is configured so that workers sharing a Docker host leave
// each other's sandboxes alone.
//
// # The daemon token
//
// A sandbox's daemon token is DaemonToken(Config.Secret, sandboxID),
// derived inside the activity whenever it is needed. It exists in exactly two
// places: the Authorization header of requests to that sandbox's daemon, and
// /eos/secret/daemon.token (mode 0600 in a 0700 directory of the state volume),
// copied in by CreateContainer with the daemon binary before the container
// first starts. It is never in Docker labels, env, argv or logs, nor in any
// activity's input or output, so it never reaches workflow history.
//
// # Inputs from strangers
//
// An activity's input may come from anyone who reached Temporal, not only
// from the gateway, so it is checked again here: the workspace_root copied
// in and an export's dest must pass Config.HostPaths (hostpath: absolute,
// no symlink, inside the allowed roots, never a system dir or the state
// dir), and a shared base volume must be named eos-base-<id> and, when it
// exists, carry our labels. A refusal is a non-retryable
// ErrInvalidArgument before anything is read or written.
//
// # Errors and retries
//
// Failures that a retry cannot fix are non-retryable temporal ApplicationErrors
// with a type from types.go: ErrInvalidArgument (bad input, missing
// configuration), ErrImageNotFound (the image is not on this host; nothing is
// ever pulled), ErrNotFound (the sandbox has no container), ErrConflict (a name
// or destination taken by something that is not ours), and ErrDaemon: the
// daemon answered with its error envelope, which is the error's one detail as
// a DaemonError {kind, message, details} (read it with AsDaemonError), so the
// conflict report of a rejected publish reaches workflows and the gateway
// unchanged. Everything else is a plain, retryable error: Docker or network
// failures, timeouts, and the daemon's server_busy and server_shutting_down.
//
// Long activities (CopyWorkspace, WaitReady, CallDaemon, ExportChanges,
// StopContainer) heartbeat, so they need a HeartbeatTimeout; outside an
// activity context the heartbeats are skipped and the methods run as plain
// functions.
package activities
