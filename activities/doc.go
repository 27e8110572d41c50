// Package activities holds the Temporal activities: every call to the Docker
// Engine and every RPC to a sandbox's daemon made on behalf of a workflow.
// They implement the contract package workflows declares: the registered
// names (workflows.ActCreateContainer, ...) and the input and output types
// (workflows.SandboxSpec, workflows.ContainerInfo, ...); the workflows never
// import this package, so nothing above the worker links the Docker client.
// The worker registers one *Activities built by New; its method names are
// the registered names.
//
// # Idempotency
//
// Activities are retried, so each one is keyed by data from its input, never
// by anything it makes up:
//
//   - A sandbox's Docker objects have deterministic names, ContainerName and
//     VolumeName of the sandbox id. CreateVolume returns the volume an earlier
//     attempt made (a volume of that name without our labels is refused as
//     invalid_request: it may hold someone's data). CreateContainer adopts a container of that
//     name that carries our labels for this sandbox and was created from the
//     same image id (ContainerInfo.Adopted), redoing the copy-in unless it runs;
//     any other container of that name is force-removed and recreated (Nomad's
//     create-or-adopt). StartContainer on a running container, StopContainer on
//     a stopped or missing one and RemoveSandbox on missing objects succeed.
//   - Every sandbox container is alone on a bridge network of its own
//     (network.go, "eos-net-<id>"): CreateContainer creates it with our labels
//     or adopts ours, refuses one of that name that is not ours, and
//     RemoveSandbox removes ours with the sandbox. Docker drops traffic
//     between bridge networks, so sandboxes (and their sessions) cannot reach
//     each other. It is not internal: Docker publishes no port of a container
//     that is only on an internal network, and the daemon port must be
//     published on 127.0.0.1. A container created before this (on the
//     default bridge) is still adopted as it is.
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
// A sandbox's daemon token is daemonclient.Token(Config.Secret, sandboxID),
// derived by the one daemon client whenever it is needed. It exists in exactly two
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
// Failures that a retry cannot fix are non-retryable ApplicationErrors that
// carry the one wire error, *api.Error (internal/apperr): invalid_request
// (bad input, missing configuration, an image that is not on this host —
// nothing is ever pulled —, a name or destination taken by something that is
// not ours), not_found (the sandbox has no container), and every refusal of
// the daemon exactly as the daemon sent it (kind, message, details), so the
// conflict report of a rejected publish reaches workflows and clients
// unchanged. Everything else is a plain, retryable error: Docker or network
// failures, timeouts, a daemon that cannot be reached (the daemon client
// looks a restarted container's new port up in Docker first), and the
// daemon's server_busy and server_shutting_down.
//
// Long activities (CopyWorkspace, WaitReady, CallDaemon, ExportChanges,
// StopContainer) heartbeat, so they need a HeartbeatTimeout; outside an
// activity context the heartbeats are skipped and the methods run as plain
// functions.
package activities
