// Package observe is the daemon's observability: the read-only views the
// RPC serves (snapshot, trace, events, resources, cgroup, topology, daemon,
// layerstack, publish_history), the sampler's collector, the record of
// every publish outcome, and the bounded store on the state volume they
// all read and write (telemetry/).
//
// The package reads the daemon only through Source (live sessions as
// snapshots, the layer store) and Config; it never imports the daemon.
//
// Invariants:
//   - Reading a view writes nothing and wakes nothing: views only query the
//     telemetry store, the layer store and /proc; the daemon serves them
//     under a quiet context, so they record no span or event, do not count
//     as activity and do not start the sampler.
//   - Views and the sampler never take a session's gate: a Session is a
//     snapshot the daemon takes under the session's read lock, so a view
//     never waits for a publish and never races one.
//   - Storage is bounded: spans and events, samples and publish records are
//     separate streams with fixed budgets on the state volume (telemetry/):
//     the oldest records give way, and a failed write is counted as a drop,
//     never returned to the operation being recorded.
//   - Every walk is bounded: an upper dir measurement visits at most
//     maxUpperWalk entries, a topology at most maxTopologyProcesses
//     processes, a publish record lists at most maxHistoryPaths paths, and
//     every answer stays under telemetry.MaxResponseBytes.
//   - Fail-open: what cannot be measured is an entry of the view's errors
//     (or a partial state), never a failed request or a stopped daemon.
//   - The sampler runs only while commands run (Running) or requests came
//     recently (Sampler.Touch), and a stack sample is written only when the
//     manifest changed.
package observe
