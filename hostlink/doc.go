// Package hostlink is the forwarder that lets one gateway reach the
// sandboxes of many Docker hosts. A sandbox's daemon publishes its port on
// 127.0.0.1 of its own host only; the host's sandbox-worker serves, on its
// advertised address (--advertise-addr), a TLS endpoint that forwards to
// those daemons:
//
//	https://<advertise>/v1/daemon/<sandbox_id>/<daemon path>
//
// Both sides authenticate. The server's certificate (self-signed, kept in
// the worker's state dir, or one from the cluster's CA) is pinned by its
// SHA-256 fingerprint, which the worker publishes in its heartbeat through
// Temporal (workflows.HostRegistryWorkflow). The caller presents the
// sandbox's daemon token (HMAC of the deployment secret and the sandbox
// id); the forwarder checks it before anything else, and forwards only to
// a sandbox container of its own host and deployment (Lookup). Bodies and
// answers stream both ways unbuffered, so the daemon client's JSON calls,
// NDJSON streams and the gateway's SSE work through it unchanged.
package hostlink
