// Package telemetry is the daemon's observability store: spans and events
// of requests, resource samples and publish outcomes as NDJSON records with
// a kind tag, kept on the state volume in bounded streams, and the
// activity-gated sampler that feeds them. It knows nothing about Docker,
// Temporal, cgroups or sessions; the daemon supplies what is measured.
//
// Invariants:
//
//   - A stream is two segments, <name>.ndjson and <name>.ndjson.1. Each holds
//     at most half the stream's budget: an append that would take the
//     current segment past it first renames it over the previous one. A
//     stream never exceeds its budget (default 4 MiB for spans and events,
//     1 MiB for samples and for publishes) and keeps at least the newest
//     half of it across daemon restarts.
//   - Every line is at most MaxLineBytes (16 KiB) with its newline. A span
//     or event that would be longer keeps what fits of its attributes and
//     carries attrs._truncated = true; anything else is dropped and counted.
//   - Writes are fail-open: an error increments the stream's drop counter
//     and is never returned to the operation being recorded. A failed write
//     is cut off (or the segment rotated) so no partial line is extended.
//   - Queries read newest first, streaming the segments backwards a chunk
//     at a time: memory is bounded by one chunk, one line and the response
//     caps (MaxRecords records, MaxResponseBytes bytes). Damaged lines are
//     skipped and counted, never fatal.
//   - Readers never write. A context marked Quiet records nothing, so the
//     daemon serves every observability view under it and reading leaves
//     the store byte for byte unchanged.
//   - The trace id is the request id. Span ids are "<proc>-<seq>"; the
//     sequence starts at the process start time in microseconds, so ids stay
//     unique within a trace across restarts.
//   - The Sampler has no goroutine and no timer while the sandbox is idle:
//     it starts on activity (Touch), samples at once and every interval, and
//     exits once nothing was touched for IdleAfter and nothing is busy.
package telemetry
