package runtime

import "github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime/sessinit"

// SessionInitMain is the session's PID 1 when the daemon binary itself is
// started as "sessinit" (package sessinit; cmd/sandbox-sessinit is the same
// code as a small binary of its own, which the daemon prefers).
func SessionInitMain(args []string) int { return sessinit.Main(args) }

// The fast exec protocol and the handed-over descriptors, shared with the
// session init.
type (
	execRequest    = sessinit.Request
	execReply      = sessinit.Reply
	compiledFilter = sessinit.Filter
)

const (
	execFDEnv      = sessinit.ExecFDEnv
	maxExecRequest = sessinit.MaxRequest
	seccompFDEnv   = sessinit.SeccompFDEnv
	exeFDEnv       = sessinit.ExeFDEnv
	readyFDEnv     = sessinit.ReadyFDEnv
)

func seccompFilters(pid string) (int, error) { return sessinit.SeccompFilters(pid) }
