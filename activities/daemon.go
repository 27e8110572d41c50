package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"go.temporal.io/sdk/temporal"
)

const (
	// DefaultDaemonTimeout bounds a daemon call without its own Timeout.
	DefaultDaemonTimeout = 5 * time.Minute
	// maxDaemonResponse caps a daemon's JSON answer (the daemon caps its
	// requests at 16 MiB too; Temporal payloads are far smaller anyway).
	maxDaemonResponse = 16 << 20
	maxRequestID      = 128
)

// Error kinds of the daemon that only say "not now": retrying helps.
const (
	kindServerBusy   = "server_busy"
	kindShuttingDown = "server_shutting_down"
)

var opPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

func (ep Endpoint) baseURL() (string, error) {
	host := ep.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if ep.Port <= 0 || ep.Port > 65535 {
		return "", invalidArgument("daemon endpoint has no valid port (%d)", ep.Port)
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(ep.Port)), nil
}

// newDaemonRequest builds a request to a sandbox's daemon with its derived
// token. The token is only ever in this header.
func (a *Activities) newDaemonRequest(ctx context.Context, method, sandboxID string, ep Endpoint, path string, body []byte, requestID string) (*http.Request, error) {
	base, err := ep.baseURL()
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, invalidArgument("daemon request: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token(sandboxID))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	return req, nil
}

// CallDaemon runs one RPC on a sandbox's daemon: POST /rpc/<op> with the
// args as the JSON body, the derived token, and call.RequestID as
// X-Request-Id. It returns the daemon's JSON result.
//
// The daemon's error envelope becomes a non-retryable ApplicationError of
// type ErrDaemon whose one detail is the envelope's *DaemonError, except
// server_busy and server_shutting_down, which are retryable plain errors
// (wrapping the *DaemonError), like connection failures and timeouts.
func (a *Activities) CallDaemon(ctx context.Context, call DaemonCall) (json.RawMessage, error) {
	if err := checkSandboxID(call.SandboxID); err != nil {
		return nil, err
	}
	if !opPattern.MatchString(call.Op) {
		return nil, invalidArgument("invalid daemon operation %q", call.Op)
	}
	if len(call.RequestID) > maxRequestID {
		return nil, invalidArgument("request id longer than %d bytes", maxRequestID)
	}
	body := []byte(call.Args)
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	} else if !json.Valid(body) {
		return nil, invalidArgument("args of %s are not valid JSON", call.Op)
	}
	timeout := call.Timeout
	if timeout <= 0 {
		timeout = DefaultDaemonTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := a.newDaemonRequest(ctx, http.MethodPost, call.SandboxID, call.Daemon, "/rpc/"+call.Op, body, call.RequestID)
	if err != nil {
		return nil, err
	}
	stop := keepHeartbeating(ctx, 5*time.Second, nil)
	defer stop()
	resp, err := a.http.Do(req)
	if err != nil && a.docker != nil && ctx.Err() == nil {
		// A restarted container gets a new ephemeral host port: look it up
		// and try once more there.
		if c, ierr := a.inspectContainer(ctx, call.SandboxID); ierr == nil {
			if ep := daemonEndpoint(c); ep.Port > 0 && ep != call.Daemon {
				if req2, rerr := a.newDaemonRequest(ctx, http.MethodPost, call.SandboxID, ep, "/rpc/"+call.Op, body, call.RequestID); rerr == nil {
					resp, err = a.http.Do(req2)
				}
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("daemon %s of sandbox %s: %w", call.Op, call.SandboxID, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxDaemonResponse+1))
	if err != nil {
		return nil, fmt.Errorf("daemon %s of sandbox %s: read answer: %w", call.Op, call.SandboxID, err)
	}
	if len(raw) > maxDaemonResponse {
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("daemon %s answered more than %d bytes", call.Op, maxDaemonResponse), ErrDaemon, nil,
			DaemonError{Kind: "response_too_large", Message: "the daemon's answer exceeds the activity's limit", Status: resp.StatusCode})
	}
	if resp.StatusCode == http.StatusOK {
		if !json.Valid(raw) {
			return nil, fmt.Errorf("daemon %s of sandbox %s: answer is not JSON", call.Op, call.SandboxID)
		}
		return json.RawMessage(raw), nil
	}
	return nil, daemonFailure(call.Op, resp.StatusCode, raw)
}

// daemonFailure maps a non-200 answer to the activity's error.
func daemonFailure(op string, status int, raw []byte) error {
	var env struct {
		Error *DaemonError `json:"error"`
	}
	if json.Unmarshal(raw, &env) != nil || env.Error == nil || env.Error.Kind == "" {
		// Not the daemon's envelope (a proxy, a crash mid-answer): server
		// errors may pass, client errors will not.
		de := &DaemonError{Kind: "bad_response", Message: fmt.Sprintf("HTTP %d: %s", status, truncate(string(raw), 512)), Status: status}
		if status >= 500 || status == http.StatusTooManyRequests {
			return fmt.Errorf("daemon %s: %w", op, de)
		}
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("daemon %s: %s", op, de.Message), ErrDaemon, nil, *de)
	}
	de := env.Error
	de.Status = status
	if de.Kind == kindServerBusy || de.Kind == kindShuttingDown {
		return fmt.Errorf("daemon %s: %w", op, de)
	}
	return temporal.NewNonRetryableApplicationError(fmt.Sprintf("daemon %s: %s: %s", op, de.Kind, de.Message), ErrDaemon, nil, *de)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// WaitReady polls the daemon's /health with the token until it answers
// 200, heartbeating; it gives up when ctx ends, or early when the container
// stopped running.
func (a *Activities) WaitReady(ctx context.Context, sandboxID string, ep Endpoint) error {
	if err := checkSandboxID(sandboxID); err != nil {
		return err
	}
	if _, err := ep.baseURL(); err != nil {
		return err
	}
	delay := 50 * time.Millisecond
	lastCheck := time.Now()
	var last error
	for attempt := 1; ; attempt++ {
		last = a.health(ctx, sandboxID, ep)
		if last == nil {
			a.log.Info("daemon ready", "sandbox_id", sandboxID, "port", ep.Port, "attempts", attempt)
			return nil
		}
		if !isRetryable(last) {
			return last // a daemon that refuses the token will go on refusing it
		}
		heartbeat(ctx, attempt)
		if time.Since(lastCheck) > time.Second {
			lastCheck = time.Now()
			c, err := a.inspectContainer(ctx, sandboxID)
			if err != nil {
				return err
			}
			if c.State == nil || !c.State.Running {
				return fmt.Errorf("daemon of sandbox %s never became ready: container %s is %s%s",
					sandboxID, c.Name, stateString(c), a.logTail(ctx, c.ID))
			}
		}
		select {
		case <-ctx.Done():
			// The daemon's supervisor restarts a failing daemon inside a
			// running container, so its output is the only clue.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return fmt.Errorf("daemon of sandbox %s not ready at %s:%d: %w (last: %v)%s",
				sandboxID, ep.Host, ep.Port, ctx.Err(), last, a.logTail(lctx, ContainerName(sandboxID)))
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// health is one GET /health.
func (a *Activities) health(ctx context.Context, sandboxID string, ep Endpoint) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := a.getHealth(ctx, sandboxID, ep)
	return err
}

// daemonHealth is what the daemon's /health says about the store.
type daemonHealth struct {
	Status          string `json:"status"`
	Sessions        int    `json:"sessions"`
	ManifestVersion int64  `json:"manifest_version"`
	LayerCount      int    `json:"layer_count"`
}

func (a *Activities) getHealth(ctx context.Context, sandboxID string, ep Endpoint) (daemonHealth, error) {
	var h daemonHealth
	req, err := a.newDaemonRequest(ctx, http.MethodGet, sandboxID, ep, "/health", nil, "")
	if err != nil {
		return h, err
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return h, err
	}
	if resp.StatusCode != http.StatusOK {
		return h, daemonFailure("health", resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, fmt.Errorf("health answer: %w", err)
	}
	return h, nil
}

// isRetryable reports whether err is not a non-retryable ApplicationError.
func isRetryable(err error) bool {
	var appErr *temporal.ApplicationError
	return !errors.As(err, &appErr) || !appErr.NonRetryable()
}
