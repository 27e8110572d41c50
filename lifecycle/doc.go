// Package lifecycle is the client side of the durable lifecycle: starting
// sandbox workflows and driving their updates, shared by the gateway and the
// worker's own tools. It holds no workflow code (that is workflows/) and
// links only the Temporal client, not the server.
//
// Invariants: a sandbox's workflow id is workflows.SandboxWorkflowID(id);
// sandboxes created together share one base volume (the leader imports, the
// others mount it read-only).
package lifecycle
