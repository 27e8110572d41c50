package activities

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// fakeDaemon is an httptest server speaking the daemon's RPC conventions.
type fakeDaemon struct {
	*httptest.Server
	token string
	calls atomic.Int64
	last  atomic.Pointer[http.Request]
	body  atomic.Pointer[[]byte]
}

func newFakeDaemon(t *testing.T, sandboxID string, h http.HandlerFunc) *fakeDaemon {
	t.Helper()
	fd := &fakeDaemon{token: daemonclient.Token(testSecret, sandboxID)}
	fd.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fd.calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		fd.last.Store(r)
		fd.body.Store(&b)
		if r.Header.Get("Authorization") != "Bearer "+fd.token {
			writeEnvelope(w, http.StatusUnauthorized, "unauthorized", "missing or wrong sandbox token", nil)
			return
		}
		h(w, r)
	}))
	t.Cleanup(fd.Close)
	return fd
}

func (fd *fakeDaemon) endpoint(t *testing.T) api.Endpoint {
	host, port, err := net.SplitHostPort(fd.Listener.Addr().String())
	require.NoError(t, err)
	p, _ := strconv.Atoi(port)
	return api.Endpoint{Host: host, Port: p}
}

func writeEnvelope(w http.ResponseWriter, status int, kind, msg string, details map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"kind": kind, "message": msg, "details": details}})
}

func TestCallDaemonSuccess(t *testing.T) {
	fd := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok","exit_code":0}`)
	})
	acts := newTestActivities(t, newFakeDocker())
	res, err := acts.CallDaemon(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", Daemon: fd.endpoint(t), Op: "exec_command",
		Args: json.RawMessage(`{"cmd":"true"}`), RequestID: "req-1"})
	require.NoError(t, err)
	require.JSONEq(t, `{"status":"ok","exit_code":0}`, string(res))
	r := fd.last.Load()
	require.Equal(t, "/rpc/exec_command", r.URL.Path)
	require.Equal(t, http.MethodPost, r.Method)
	require.Equal(t, "req-1", r.Header.Get("X-Request-Id"))
	require.Equal(t, `{"cmd":"true"}`, string(*fd.body.Load()))

	// No args: an empty object.
	_, err = acts.CallDaemon(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", Daemon: fd.endpoint(t), Op: "health"})
	require.NoError(t, err)
	require.Equal(t, `{}`, string(*fd.body.Load()))
}

func TestCallDaemonErrorMapping(t *testing.T) {
	conflictDetails := map[string]any{"session_retained": true, "conflicts": []any{map[string]any{"path": "f.txt", "kind": "content"}}}
	for _, tc := range []struct {
		name      string
		status    int
		kind      string
		details   map[string]any
		retryable bool
	}{
		{"conflict report", http.StatusConflict, "operation_failed", conflictDetails, false},
		{"not found", http.StatusNotFound, "not_found", map[string]any{}, false},
		{"internal", http.StatusInternalServerError, "internal_error", map[string]any{}, false},
		{"busy", http.StatusTooManyRequests, "server_busy", map[string]any{"max_concurrent_requests": float64(128)}, true},
		{"shutting down", http.StatusServiceUnavailable, "server_shutting_down", map[string]any{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
				writeEnvelope(w, tc.status, tc.kind, "it went wrong", tc.details)
			})
			acts := newTestActivities(t, newFakeDocker())
			_, err := acts.CallDaemon(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", Daemon: fd.endpoint(t), Op: "publish_workspace_session"})
			require.Error(t, err)
			requireAppError(t, err, tc.kind, !tc.retryable)
			de, ok := apperr.From(err)
			require.True(t, ok)
			require.Equal(t, tc.kind, de.Kind)
			require.Equal(t, "it went wrong", de.Message)
			require.Equal(t, tc.details, de.Details)
		})
	}
}

func TestCallDaemonWrongTokenIsNotRetried(t *testing.T) {
	fd := newFakeDaemon(t, "another-sandbox", func(w http.ResponseWriter, r *http.Request) {
		t.Error("must not be reached")
	})
	acts := newTestActivities(t, newFakeDocker())
	_, err := acts.CallDaemon(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", Daemon: fd.endpoint(t), Op: "health"})
	requireAppError(t, err, api.KindUnauthorized, true)
	de, ok := apperr.From(err)
	require.True(t, ok)
	require.Equal(t, "unauthorized", de.Kind)
}

func TestCallDaemonTransportFailuresAreRetryable(t *testing.T) {
	acts := newTestActivities(t, newFakeDocker())

	// Nothing listens.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	_, err = acts.CallDaemon(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", Daemon: api.Endpoint{Host: "127.0.0.1", Port: port}, Op: "health"})
	require.Error(t, err)
	require.True(t, retryable(err), "%v", err)

	// Too slow for the call's timeout.
	release := make(chan struct{})
	fd := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	start := time.Now()
	_, err = acts.CallDaemon(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", Daemon: fd.endpoint(t), Op: "exec_command", Timeout: 100 * time.Millisecond})
	require.Error(t, err)
	require.True(t, retryable(err), "%v", err)
	require.Less(t, time.Since(start), 5*time.Second)

	// A proxy's non-envelope 502.
	fd2 := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad gateway", http.StatusBadGateway)
	})
	_, err = acts.CallDaemon(context.Background(), workflows.DaemonCall{SandboxID: "sbx1", Daemon: fd2.endpoint(t), Op: "health"})
	require.Error(t, err)
	require.True(t, retryable(err), "%v", err)
}

func TestCallDaemonRejectsBadCalls(t *testing.T) {
	acts := newTestActivities(t, newFakeDocker())
	ep := api.Endpoint{Host: "127.0.0.1", Port: 1}
	for _, call := range []workflows.DaemonCall{
		{SandboxID: "sbx1", Daemon: ep, Op: "../health"},
		{SandboxID: "sbx1", Daemon: ep, Op: ""},
		{SandboxID: "sbx1", Daemon: api.Endpoint{}, Op: "health"},
		{SandboxID: "sbx1", Daemon: ep, Op: "health", Args: json.RawMessage(`{nope`)},
		{SandboxID: "", Daemon: ep, Op: "health"},
	} {
		_, err := acts.CallDaemon(context.Background(), call)
		requireAppError(t, err, api.KindInvalidRequest, true)
	}
}

// startedSandbox is fake Docker with sandbox sbx1's container created and
// started, and activities over it.
func startedSandbox(t *testing.T) (*fakeDocker, *Activities) {
	t.Helper()
	d := newFakeDocker()
	acts := newTestActivities(t, d)
	_, err := acts.CreateContainer(context.Background(), testSpec("sbx1"))
	require.NoError(t, err)
	_, err = acts.StartContainer(context.Background(), "sbx1")
	require.NoError(t, err)
	return d, acts
}

func TestWaitReady(t *testing.T) {
	_, acts := startedSandbox(t)
	ctx := context.Background()

	var n atomic.Int64
	fd := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/health", r.URL.Path)
		if n.Add(1) < 3 {
			writeEnvelope(w, http.StatusServiceUnavailable, "server_shutting_down", "starting", nil)
			return
		}
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	})
	require.NoError(t, acts.WaitReady(ctx, "sbx1", fd.endpoint(t)))
	require.EqualValues(t, 3, n.Load())

	// A daemon that refuses the token is not waited for.
	wrong := newFakeDaemon(t, "other", func(w http.ResponseWriter, r *http.Request) {})
	err := acts.WaitReady(ctx, "sbx1", wrong.endpoint(t))
	requireAppError(t, err, api.KindUnauthorized, true)

	// Nothing answers: give up with the context.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = acts.WaitReady(tctx, "sbx1", api.Endpoint{Host: "127.0.0.1", Port: port})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A container Docker keeps restarting (its daemon exits at once: a binary
// the image cannot run, a bad flag) ends the wait with the reason, not
// after the activity's timeout; so does one restarted twice meanwhile.
func TestWaitReadyGivesUpOnARestartLoop(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := api.Endpoint{Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}
	require.NoError(t, l.Close())
	defer func(d time.Duration) { restartLoopExitWait = d }(restartLoopExitWait)
	restartLoopExitWait = 500 * time.Millisecond
	var atGiveUp int // the inspect that found the loop
	for _, tc := range []struct {
		name string
		set  func(c *container.InspectResponse, checks int)
		want string
	}{
		{"in its restart back-off", func(c *container.InspectResponse, _ int) {
			c.State.Restarting, c.State.ExitCode, c.RestartCount = true, 127, 3
		}, "(exit code 127, 3 restarts)"},
		// Running again by every check: Docker cleared the exit code.
		{"restarted between two checks, then seen in its back-off", func(c *container.InspectResponse, checks int) {
			if atGiveUp == 0 && checks >= 2 {
				atGiveUp = checks
			}
			c.RestartCount = 5 + 2*checks
			if atGiveUp > 0 && checks >= atGiveUp+3 {
				c.State.Restarting, c.State.ExitCode = true, 2
			}
		}, "(exit code 2, "},
		{"restarted between two checks, never seen stopped", func(c *container.InspectResponse, checks int) {
			c.RestartCount = 5 + 2*checks
		}, "restarts)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, acts := startedSandbox(t)
			ctx := context.Background()
			d.onInspect = func(c *container.InspectResponse, checks int) { tc.set(c, checks) }
			tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			err = acts.WaitReady(tctx, "sbx1", nobody)
			e := requireAppError(t, err, api.KindOperationFailed, true)
			require.Contains(t, e.Error(), "keeps exiting")
			require.Contains(t, e.Error(), tc.want)
			if !strings.Contains(tc.want, "exit code") {
				require.NotContains(t, e.Error(), "exit code", "a running container's exit code (0) is not its daemon's")
			}
			require.NoError(t, tctx.Err(), "it did not wait for the deadline")
		})
	}
	// A container that restarted before the wait (an adopted sandbox) and
	// runs on is waited for as usual.
	d, acts := startedSandbox(t)
	ctx := context.Background()
	d.onInspect = func(c *container.InspectResponse, _ int) { c.RestartCount = 7 }
	tctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, acts.WaitReady(tctx, "sbx1", nobody), context.DeadlineExceeded)
}

// A daemon that exits at once inside a running container is restarted by
// the container's supervisor, not by Docker: three of its restart lines
// since the wait began end the wait with the output; two do not.
func TestWaitReadyGivesUpOnADaemonItsSupervisorKeepsRestarting(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := api.Endpoint{Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port}
	require.NoError(t, l.Close())
	restart := `{"time":"2026-12-06T10:00:00Z","level":"ERROR","msg":"` + api.DaemonRestartLog + `","component":"pid1","exit_code":2,"ran":"3ms"}` + "\n"
	failed := "flag provided but not defined: -no-such-flag\n"

	d, acts := startedSandbox(t)
	d.logs = strings.Repeat(failed+restart, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = acts.WaitReady(ctx, "sbx1", nobody)
	e := requireAppError(t, err, api.KindOperationFailed, true)
	require.Contains(t, e.Error(), "exited 3 times")
	require.Contains(t, e.Error(), "no-such-flag")
	require.NoError(t, ctx.Err(), "it did not wait for the deadline")

	// Two, and lines that only quote the supervisor's (a path or command
	// the daemon logged) or come from another component, do not.
	quoted, _ := json.Marshal(map[string]string{"msg": "file_read", "component": "daemon", "path": restart})
	d, acts = startedSandbox(t)
	d.logs = strings.Repeat(failed+restart, 2) + strings.ReplaceAll(restart, `"pid1"`, `"daemon"`) + string(quoted) + "\n" +
		"panic: " + restart
	tctx, tcancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer tcancel()
	require.ErrorIs(t, acts.WaitReady(tctx, "sbx1", nobody), context.DeadlineExceeded)
}

// retryable reports whether err is not a non-retryable ApplicationError.
func retryable(err error) bool {
	var appErr *temporal.ApplicationError
	return !errors.As(err, &appErr) || !appErr.NonRetryable()
}
