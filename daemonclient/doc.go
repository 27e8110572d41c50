// Package daemonclient is the one client of the sandbox daemons' RPC, used
// by the gateway (runtime and observability ops) and by the activities
// (the steps of lifecycle workflows).
//
// It owns everything about talking to a daemon: the per-sandbox token
// derived from the deployment secret (never stored), the request id header,
// the answer cap, the error envelope (every daemon refusal comes back as
// the *api.Error the daemon sent, unchanged), NDJSON streaming of command
// output, and following a daemon whose container restarted on another host
// port (a Resolver asked only after a refused connection, which by
// definition never reached the daemon, so the retry runs nothing twice).
//
// It imports neither Temporal nor Docker nor gin: the callers map its
// errors once at their edge (an activity into a Temporal ApplicationError,
// the gateway into its answer).
package daemonclient
