// Package bench is the benchmark suite behind `make bench` (cmd/sandbox-bench):
// the product as `make run` starts it (embedded Temporal, workers, gateway),
// driven over HTTP like any client, each scenario beside the baseline a user
// would otherwise pick — a container per agent driven through the Docker
// Engine API, a git worktree per agent — in the same process and run, so
// both see the same machine noise.
//
// Invariants: every number in a report comes from samples recorded in the
// same run and written raw to its CSV; percentiles are nearest-rank over the
// successful samples; failures are counted, never dropped silently; the
// suite cleans up every sandbox and baseline container it made.
package bench
