package sandboxinit

import (
	"sort"
	"sync"
	"time"
	"unicode/utf8"
)

// maxCommandAttr caps a command line kept in spans and views.
const maxCommandAttr = 512

// execution is a command running in a session, as the views show it.
type execution struct {
	id      string // command_session_id, once Start returned
	ws      string
	cmd     string
	trace   string
	started time.Time
}

// executions are the running commands. An entry exists from just before a
// command starts until its OnExit, so a command that ends before Start
// returns is still removed exactly once.
type executions struct {
	mu sync.Mutex
	m  map[*execution]struct{}
}

func (e *executions) add(x *execution) {
	e.mu.Lock()
	if e.m == nil {
		e.m = map[*execution]struct{}{}
	}
	e.m[x] = struct{}{}
	e.mu.Unlock()
}

func (e *executions) remove(x *execution) {
	e.mu.Lock()
	delete(e.m, x)
	e.mu.Unlock()
}

func (e *executions) setID(x *execution, id string) {
	e.mu.Lock()
	x.id = id
	e.mu.Unlock()
}

func (e *executions) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.m)
}

// list returns copies of the running commands of session ws ("" for all),
// oldest first.
func (e *executions) list(ws string) []execution {
	e.mu.Lock()
	out := make([]execution, 0, len(e.m))
	for x := range e.m {
		if ws == "" || x.ws == ws {
			out = append(out, *x)
		}
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].started.Before(out[j].started) })
	return out
}

func capCommand(cmd string) string {
	if len(cmd) <= maxCommandAttr {
		return cmd
	}
	n := maxCommandAttr
	for n > 0 && !utf8.RuneStart(cmd[n]) {
		n--
	}
	return cmd[:n] + "…"
}
