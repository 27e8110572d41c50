package worker

import (
	"os"
	"runtime/debug"
)

// gcPercent is the collector's target for the processes that embed
// Temporal or run its workers: most of their CPU per durable step is the
// server's own work, and with Go's default (GOGC=100) 5-6% of it was the
// collector's. Measured on 2 cores, a session create and destroy through
// the sandbox workflow: 8.7-10.4 ms of CPU each at 100 against 7.7-9.8 ms
// at 300, for a heap that grows to about four times the live one instead
// of twice (the embedded server's live heap is 30-60 MB).
const gcPercent = 300

// TuneGC sets the collector to gcPercent unless GOGC says otherwise.
func TuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
