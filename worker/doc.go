// Package worker wires the durable lifecycle together: it starts the
// embedded Temporal dev server when no cluster is configured, connects the
// client, registers the workflows and activities under their stable names,
// runs the workers (the shared task queue and this host's own queue), and
// reconciles Docker objects nobody owns.
//
// Invariants: workflows and activities are registered by explicit names
// (registration aliasing is off); sandbox activities run on the task queue
// of the host that owns the sandbox; the reconciler removes only objects
// carrying our labels whose sandbox workflow is not running.
//
// Only the product talks to the embedded Temporal: its frontend refuses
// every RPC that lacks FrontendToken(secret), and every client built here
// presents the token; its internal services (history, matching, and the
// internal frontend of Temporal's system worker) accept only internode
// mTLS with a certificate made in memory at each start. The UI is off
// unless asked for, and then sits behind a Host check and a login (ui.go).
package worker
