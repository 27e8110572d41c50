package observe

import (
	"sort"
	"sync"
	"time"
	"unicode/utf8"
)

// maxCommandAttr caps a command line kept in spans and views.
const maxCommandAttr = 512

// Execution is a command running in a session, as the views show it.
type Execution struct {
	ID        string // command_session_id, once Start returned (set with SetID)
	Workspace string
	Cmd       string // capped (CapCommand)
	Trace     string
	Started   time.Time
}

// Executions are the running commands. An entry exists from just before a
// command starts until its OnExit, so a command that ends before Start
// returns is still removed exactly once.
type Executions struct {
	mu sync.Mutex
	m  map[*Execution]struct{}
}

// Add registers x just before its command starts.
func (e *Executions) Add(x *Execution) {
	e.mu.Lock()
	if e.m == nil {
		e.m = map[*Execution]struct{}{}
	}
	e.m[x] = struct{}{}
	e.mu.Unlock()
}

// Remove forgets x once its command ended (or never started).
func (e *Executions) Remove(x *Execution) {
	e.mu.Lock()
	delete(e.m, x)
	e.mu.Unlock()
}

// SetID records x's command session id once Start returned it.
func (e *Executions) SetID(x *Execution, id string) {
	e.mu.Lock()
	x.ID = id
	e.mu.Unlock()
}

// Count is how many commands run now.
func (e *Executions) Count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.m)
}

// List returns copies of the running commands of session ws ("" for all),
// oldest first.
func (e *Executions) List(ws string) []Execution {
	e.mu.Lock()
	out := make([]Execution, 0, len(e.m))
	for x := range e.m {
		if ws == "" || x.Workspace == ws {
			out = append(out, *x)
		}
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

// CapCommand cuts a command line to maxCommandAttr bytes (at a rune
// boundary) for spans and views.
func CapCommand(cmd string) string {
	if len(cmd) <= maxCommandAttr {
		return cmd
	}
	n := maxCommandAttr
	for n > 0 && !utf8.RuneStart(cmd[n]) {
		n--
	}
	return cmd[:n] + "…"
}
