package workflows

import (
	"encoding/json"
	"sync"

	"go.temporal.io/sdk/workflow"
)

// The state mirror: reads of a sandbox's state that need not wait for its
// workflow task.
//
// A query of a workflow whose task is open (each session create, destroy
// or publish keeps it open for its daemon call, and under load the tasks
// follow each other) waits for that task and is answered with the next
// one: at 50 agents, 0.3-1 s for a console's inspect_sandbox. So the
// sandbox workflow, in the process whose worker runs it, leaves a copy of
// its state here in every workflow task and when update handlers start
// (mirrorLoop), with the run and the history length it has seen (up to
// the task being worked on).
// MirroredState returns it only while the history, as the server describes
// it, is no longer than that: no event the copy has not seen. Otherwise
// (a task completed since, a signal, another process runs the workflow,
// another run) the caller queries as before.
//
// A copy written while a task is open may show an update's effect a
// moment before the task that records it completes. Nothing is written
// while the workflow replays, and the workflow's decisions never read it.

type mirrored struct {
	runID       string
	historyLen  int64
	state       []byte // JSON, as the state query answers
	lastPublish []byte // JSON, as the last_publish query answers
}

var mirror sync.Map // workflow id → *mirrored

// mirrorLoop copies the state once per workflow task (its history length
// moved) and again in a pass of the workflow's code in which update
// handlers started (after every handler of the pass ran up to its first
// wait: one copy for a task's whole batch of updates). A copy when a
// handler ends would serve no one: its task completes right after, and
// the history then has events the copy has not seen.
func (s *sandbox) mirrorLoop(ctx workflow.Context) {
	var copied int
	for {
		if err := workflow.Await(ctx, func() bool {
			return s.mirrorStale || workflow.GetInfo(ctx).GetCurrentHistoryLength() != copied
		}); err != nil {
			return
		}
		s.mirrorStale = false
		copied = workflow.GetInfo(ctx).GetCurrentHistoryLength()
		s.mirrorState(ctx)
	}
}

// mirrorState leaves s's state in the mirror (see above).
func (s *sandbox) mirrorState(ctx workflow.Context) {
	if workflow.IsReplaying(ctx) {
		return
	}
	info := workflow.GetInfo(ctx)
	_ = mirrorRecords(info.WorkflowExecution.ID, info.WorkflowExecution.RunID, int64(info.GetCurrentHistoryLength()), s.state, s.lastPublish)
}

// forgetMirrored drops the run's copy when it ends (outside replay).
func (s *sandbox) forgetMirrored(ctx workflow.Context) {
	if !workflow.IsReplaying(ctx) {
		ForgetMirrored(workflow.GetInfo(ctx).WorkflowExecution.ID)
	}
}

// Mirror leaves a copy of st, the state run runID of workflow id had after
// historyLen events, in this process's mirror: what the sandbox workflow
// does outside replay (readers' tests call it too).
func Mirror(workflowID, runID string, historyLen int64, st *SandboxState) error {
	return mirrorRecords(workflowID, runID, historyLen, st, nil)
}

// mirrorRecords is Mirror with the run's last publish (nil: none yet).
func mirrorRecords(workflowID, runID string, historyLen int64, st *SandboxState, last *PublishRecord) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	lp, err := json.Marshal(last)
	if err != nil {
		return err
	}
	mirror.Store(workflowID, &mirrored{runID: runID, historyLen: historyLen, state: b, lastPublish: lp})
	return nil
}

// MirroredLastPublish is the last publish the run recorded (nil: none
// yet), from the copy MirroredState reads, under the same condition.
func MirroredLastPublish(workflowID, runID string, historyLen int64) (*PublishRecord, bool) {
	m, ok := current(workflowID, runID, historyLen)
	if !ok {
		return nil, false
	}
	var rec *PublishRecord
	if len(m.lastPublish) > 0 && json.Unmarshal(m.lastPublish, &rec) != nil {
		return nil, false
	}
	return rec, true
}

// MirroredState is the state workflow id's run runID left in this process,
// if it has seen every event of a history of historyLen events (what
// DescribeWorkflowExecution says now); false when there is none that new.
func MirroredState(workflowID, runID string, historyLen int64) (*SandboxState, bool) {
	m, ok := current(workflowID, runID, historyLen)
	if !ok {
		return nil, false
	}
	var st SandboxState
	if json.Unmarshal(m.state, &st) != nil {
		return nil, false
	}
	return &st, true
}

// MirroredCopy is the copy MirroredState and MirroredLastPublish read, as
// JSON: what a host's forwarder serves a gateway elsewhere.
type MirroredCopy struct {
	State       json.RawMessage `json:"state"`        // as the state query answers
	LastPublish json.RawMessage `json:"last_publish"` // as the last_publish query answers (null: none yet)
}

// MirroredCopyJSON is workflow id's copy, encoded, under MirroredState's
// condition.
func MirroredCopyJSON(workflowID, runID string, historyLen int64) ([]byte, bool) {
	m, ok := current(workflowID, runID, historyLen)
	if !ok {
		return nil, false
	}
	b, err := json.Marshal(MirroredCopy{State: m.state, LastPublish: m.lastPublish})
	return b, err == nil
}

// current is workflow id's copy if it is of run runID and has seen every
// event of a history historyLen long.
func current(workflowID, runID string, historyLen int64) (*mirrored, bool) {
	v, ok := mirror.Load(workflowID)
	if !ok {
		return nil, false
	}
	m := v.(*mirrored)
	if runID == "" || m.runID != runID || historyLen <= 0 || historyLen > m.historyLen {
		return nil, false
	}
	return m, true
}

// HasMirrored is whether this process has a copy of workflow id's state
// (its worker ran the workflow), whatever its age.
func HasMirrored(workflowID string) bool {
	_, ok := mirror.Load(workflowID)
	return ok
}

// ForgetMirrored drops workflow id's copy (its run ended).
func ForgetMirrored(workflowID string) { mirror.Delete(workflowID) }
