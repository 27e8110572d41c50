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
package worker
