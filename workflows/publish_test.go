package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
)

var publishIn = PublishInput{SandboxID: "sb1", Daemon: daemonEP, SessionID: "ws-1", TxID: "publish/sb1/ws-1/1"}

// publishDaemon answers the publish steps: fail decides, per op and
// attempt (1-based), whether the call fails; otherwise okDaemon answers.
type publishDaemon struct {
	calls map[string]int
	fail  func(op string, attempt int) error
}

func (p *publishDaemon) answer(_ context.Context, call DaemonCall) (json.RawMessage, error) {
	p.calls[call.Op]++
	if p.fail != nil {
		if err := p.fail(call.Op, p.calls[call.Op]); err != nil {
			return nil, err
		}
	}
	if call.Op == "publish_abort" {
		return json.RawMessage(`{"txid":"publish/sb1/ws-1/1","workspace_session_id":"ws-1","aborted":true}`), nil
	}
	return okDaemon(call)
}

func runPublish(t *testing.T, fail func(op string, attempt int) error) (*publishDaemon, error) {
	e := newEnv(t)
	e.SetTestTimeout(time.Minute)
	d := &publishDaemon{calls: map[string]int{}, fail: fail}
	e.OnActivity(acts.CallDaemon, mock.Anything, mock.Anything).Return(d.answer)
	e.ExecuteWorkflow(PublishWorkflowName, publishIn)
	require.True(t, e.IsWorkflowCompleted())
	return d, e.GetWorkflowError()
}

var errUnreachable = errors.New("dial tcp 127.0.0.1:40001: connect: connection refused")

func TestPublishSettles(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(op string, attempt int) error
		// want: calls per op; kind: the publish's error kind ("" = it succeeded).
		want map[string]int
		kind string
	}{
		{name: "clean", want: map[string]int{"publish_prepare": 1, "publish_commit": 1, "publish_finalize": 1}},
		{name: "prepare refused: aborted", kind: api.KindOperationFailed,
			fail: func(op string, _ int) error {
				if op == "publish_prepare" {
					return apperr.Newf(api.KindOperationFailed, map[string]any{"stage": "capture"}, "capture failed: no space left on device")
				}
				return nil
			},
			want: map[string]int{"publish_prepare": 1, "publish_abort": 1}},
		{name: "session destroyed meanwhile: not_found, aborted", kind: api.KindNotFound,
			fail: func(op string, _ int) error {
				if op == "publish_prepare" {
					return apperr.Newf(api.KindNotFound, map[string]any{"workspace_session_id": "ws-1"}, "workspace session not found: ws-1")
				}
				return nil
			},
			want: map[string]int{"publish_prepare": 1, "publish_abort": 1}},
		{name: "prepare unreachable past its retries: aborted once the daemon is back",
			fail: func(op string, n int) error {
				// 200 failed aborts: over an hour at the capped backoff.
				if op == "publish_prepare" || (op == "publish_abort" && n <= 200) {
					return errUnreachable
				}
				return nil
			},
			want: map[string]int{"publish_prepare": 10, "publish_abort": 201}},
		{name: "commit refused: abort retried until it succeeds", kind: api.KindOperationFailed,
			fail: func(op string, n int) error {
				switch {
				case op == "publish_commit":
					return apperr.Newf(api.KindOperationFailed, nil, "commit failed: input/output error")
				case op == "publish_abort" && n <= 5:
					return errUnreachable
				}
				return nil
			},
			want: map[string]int{"publish_prepare": 1, "publish_commit": 1, "publish_abort": 6}},
		{name: "commit answered but lost: the abort finds it committed and finalizes",
			fail: func(op string, _ int) error {
				switch op {
				case "publish_commit":
					return errUnreachable
				case "publish_abort":
					return apperr.Newf(api.KindOperationFailed, map[string]any{"committed": true}, "publish is committed: finalize it")
				}
				return nil
			},
			want: map[string]int{"publish_prepare": 1, "publish_commit": 10, "publish_abort": 1, "publish_finalize": 1}},
		{name: "finalize retried until it succeeds",
			fail: func(op string, n int) error {
				if op == "publish_finalize" && n <= 30 {
					return errUnreachable
				}
				return nil
			},
			want: map[string]int{"publish_prepare": 1, "publish_commit": 1, "publish_finalize": 31}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := runPublish(t, tc.fail)
			require.Equal(t, tc.want, d.calls)
			if tc.name == "prepare unreachable past its retries: aborted once the daemon is back" {
				require.Error(t, err, "the publish fails: its prepare never answered")
				return
			}
			if tc.kind == "" {
				require.NoError(t, err)
				return
			}
			e, ok := apperr.From(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, tc.kind, e.Kind)
			require.NotContains(t, e.Details, "abort_failed")
		})
	}
}

// An abort the daemon refuses is not discarded: the publish's error says
// so and names the recovery operation.
func TestPublishAbortRefusedIsReported(t *testing.T) {
	d, err := runPublish(t, func(op string, _ int) error {
		switch op {
		case "publish_commit":
			return apperr.Newf(api.KindOperationFailed, nil, "commit failed")
		case "publish_abort":
			return apperr.Newf(api.KindInternal, nil, "abort: read-only file system")
		}
		return nil
	})
	require.Equal(t, 1, d.calls["publish_abort"])
	e, ok := apperr.From(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, api.KindOperationFailed, e.Kind)
	require.Contains(t, e.Details["abort_failed"], "read-only file system")
	require.Equal(t, "recover_workspace_session", e.Details["recovery_operation"])
}

// A daemon that restarted between prepare and commit aborted the prepared
// publish at boot: the workflow starts over under a new txid and commits
// once; it gives up after maxPublishRestarts.
func TestPublishStartsOverAfterTheDaemonAbortedIt(t *testing.T) {
	for _, tc := range []struct {
		name     string
		by       string // details.aborted_by of the refused commits
		restarts int    // commits refused as aborted
		commits  int    // commit attempts (txids)
		ok       bool
	}{
		{"once", "daemon_restart", 1, 2, true},
		{"every time", "daemon_restart", maxPublishRestarts + 1, maxPublishRestarts + 1, false},
		{"aborted on purpose by recover_workspace_session", "recover", 1, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aborted := apperr.New(api.Errorf(api.KindOperationFailed, map[string]any{"aborted": true, "aborted_by": tc.by, "session_retained": true},
				"publish was aborted before it committed"))
			e := newEnv(t)
			var txids []string
			e.OnActivity(acts.CallDaemon, mock.Anything, mock.Anything).Return(func(_ context.Context, call DaemonCall) (json.RawMessage, error) {
				var a api.PublishStepArgs
				require.NoError(t, json.Unmarshal(call.Args, &a))
				if call.Op == "publish_commit" {
					txids = append(txids, a.TxID)
					if len(txids) <= tc.restarts {
						return nil, aborted
					}
				}
				return okDaemon(call)
			})
			e.ExecuteWorkflow(PublishWorkflowName, publishIn)
			require.True(t, e.IsWorkflowCompleted())
			require.Len(t, txids, tc.commits)
			if !tc.ok {
				e, ok := apperr.From(e.GetWorkflowError())
				require.True(t, ok)
				require.Equal(t, true, e.Details["aborted"])
				return
			}
			require.NoError(t, e.GetWorkflowError())
			require.Equal(t, []string{publishIn.TxID, publishIn.TxID + "/again-1"}, txids)
		})
	}
}

// TestLastPublishMemoCoalesced: the last_publish query answers the latest
// publish at once; the memo is upserted at once for a publish a second
// after the last upsert, and publishes closer than that share one upsert,
// of the latest, when the second is up; the end of the run leaves nothing
// unrecorded.
func TestLastPublishMemoCoalesced(t *testing.T) {
	e := newEnv(t)
	e.happyCreate()
	e.daemon(okDaemon)
	e.OnActivity(acts.RemoveSandbox, mock.Anything, "sb1").Return(nil)
	var memos []string // the txid of each upsert
	e.OnUpsertMemo(mock.Anything).Run(func(args mock.Arguments) {
		rec := args.Get(0).(map[string]interface{})[MemoLastPublish].(PublishRecord)
		memos = append(memos, rec.TxID)
	}).Return(nil)
	lastTx := func() string {
		v, err := e.QueryWorkflow(QueryLastPublish)
		require.NoError(t, err)
		var rec *PublishRecord
		require.NoError(t, v.Get(&rec))
		require.NotNil(t, rec)
		return rec.TxID
	}
	tx := func(n int) string { return PublishWorkflowID("sb1", "ws-1", n) }
	publish := step{name: UpdatePublish, args: []any{PublishRequest{WorkspaceSessionID: "ws-1"}}, check: ok(t)}
	p1, p2, p3 := publish, publish, publish
	p1.then = func() {
		require.Equal(t, tx(1), lastTx())
		require.Equal(t, []string{tx(1)}, memos, "the first publish is in the memo at once")
	}
	p2.then = func() {
		require.Equal(t, tx(2), lastTx(), "the query is never behind")
		require.Equal(t, []string{tx(1)}, memos, "a publish right after: no upsert yet")
	}
	p3.then = func() {
		require.Equal(t, tx(3), lastTx())
		require.Equal(t, []string{tx(1)}, memos)
		e.RegisterDelayedCallback(func() {
			require.Equal(t, []string{tx(1), tx(3)}, memos, "one upsert, of the latest, a second later")
		}, 3*time.Second)
	}
	create := step{name: UpdateCreateSession, check: ok(t)}
	e.script(time.Second, step{name: UpdateWaitReady, check: ok(t)}, create, p1, create, p2, create, p3)
	e.RegisterDelayedCallback(func() {
		e.UpdateWorkflow(UpdateDestroy, "destroy", &testsuite.TestUpdateCallback{OnAccept: func() {}, OnReject: func(error) {}, OnComplete: func(any, error) {}})
	}, time.Minute)
	e.ExecuteWorkflow(SandboxWorkflowName, SandboxInput{Spec: spec})
	require.NoError(t, e.GetWorkflowError())
	require.Equal(t, []string{tx(1), tx(3)}, memos, "nothing more at the end: the memo already showed the latest")
}
