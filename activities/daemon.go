package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/hostdir"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
	"go.temporal.io/sdk/temporal"
)

// CallDaemon runs one RPC on a sandbox's daemon through the one daemon
// client (daemonclient): POST /rpc/<op> with the args as the JSON body, the
// derived token, and call.RequestID as X-Request-Id. It returns the
// daemon's JSON result.
//
// A refusal of the daemon becomes a non-retryable ApplicationError that
// carries the daemon's *api.Error unchanged (apperr); server_busy and
// server_shutting_down are retryable, like a daemon that cannot be reached
// (a container restarting: the client looks its new port up in Docker).
func (a *Activities) CallDaemon(ctx context.Context, call workflows.DaemonCall) (json.RawMessage, error) {
	if err := checkSandboxID(call.SandboxID); err != nil {
		return nil, err
	}
	stop := keepHeartbeating(ctx, heartbeatEvery, nil)
	defer stop()
	out, _, err := a.daemon.Do(ctx, daemonclient.Call{SandboxID: call.SandboxID, Endpoint: call.Daemon, Direct: call.Direct, Op: call.Op,
		Args: call.Args, RequestID: call.RequestID, Timeout: call.Timeout})
	return out, activityError(err)
}

// CallDaemonHere is CallDaemon as a local activity, in the workflow
// task of the sandbox's workflow, without heartbeats. A sandbox's workflow
// runs on any worker of the cluster: on a worker of another host than the
// sandbox's, the call goes through that host's forwarder (hostlink), as
// the gateway's calls do. Only the daemon's own answer counts as one:
// anything else — no live host with a forwarder in the registry, a
// forwarder that cannot reach or find the daemon, a broken connection —
// answers not_here or a plain error, and the workflow calls CallDaemon on
// the sandbox's host queue instead, as it does for a call that could not
// reach a daemon of this host.
func (a *Activities) CallDaemonHere(ctx context.Context, call workflows.DaemonCall) (json.RawMessage, error) {
	if err := checkSandboxID(call.SandboxID); err != nil {
		return nil, err
	}
	if call.HostQueue != "" && call.HostQueue != HostQueueOf(a) {
		return a.callOtherHost(ctx, call)
	}
	out, _, err := a.daemon.Do(ctx, daemonclient.Call{SandboxID: call.SandboxID, Endpoint: call.Daemon, Direct: call.Direct, Op: call.Op,
		Args: call.Args, RequestID: call.RequestID, Timeout: call.Timeout})
	return out, activityError(err)
}

// callOtherHost is CallDaemonHere for a sandbox of another host: through
// its forwarder, or not_here.
func (a *Activities) callOtherHost(ctx context.Context, call workflows.DaemonCall) (json.RawMessage, error) {
	notHere := func(why string) error {
		return temporal.NewNonRetryableApplicationError("the sandbox's daemon is on another host: "+why, workflows.ErrTypeNotHere, nil)
	}
	reg := a.hostRegistry()
	if reg == nil {
		return nil, notHere("this worker knows no other host")
	}
	h, found, err := a.hosts.Host(ctx, reg, call.HostQueue)
	switch {
	case err != nil:
		return nil, notHere(err.Error())
	case !found:
		return nil, notHere("no host of queue " + call.HostQueue + " is registered")
	case !h.Live(time.Now()):
		return nil, notHere("host " + h.Name + " is not live")
	case hostdir.Via(h) == nil:
		return nil, notHere("host " + h.Name + " advertises no forwarder")
	}
	via := hostdir.Via(h)
	if until, ok := a.unreachable.Load(via.Addr); ok && time.Now().Before(until.(time.Time)) {
		return nil, notHere("this worker could not reach the forwarder of host " + h.Name + " lately")
	}
	out, _, err := a.remote.Do(ctx, daemonclient.Call{SandboxID: call.SandboxID, Endpoint: call.Daemon, Op: call.Op, Args: call.Args, RequestID: call.RequestID,
		Timeout: call.Timeout, Via: via})
	var ce *daemonclient.ConnError
	if errors.As(err, &ce) && ce.Refused && !daemonclient.IsForwardRefused(err) {
		// The forwarder itself could not be dialled (a firewall between
		// the hosts, say): the host's queue serves this sandbox's calls
		// for a while, without a dial each.
		a.unreachable.Store(via.Addr, time.Now().Add(forwarderRetryAfter))
		a.log.Warn("the forwarder of another host cannot be reached from this worker; its sandboxes' calls go through its queue", "host", h.Name,
			"forwarder", via.Addr, "retry_after", forwarderRetryAfter, "err", err)
	}
	var ae *api.Error
	var fe *daemonclient.ForwarderError
	if err != nil && (!errors.As(err, &ae) || errors.As(err, &fe)) {
		return nil, fmt.Errorf("%s through the forwarder of host %s: %w", call.Op, h.Name, err)
	}
	return out, activityError(err)
}

// forwarderDialTimeout bounds a dial of another host's forwarder from a
// local daemon call (whose own bound is 500 ms for a publish): hosts of
// one cluster connect in milliseconds. One that cannot be dialled is left
// alone for forwarderRetryAfter.
const (
	forwarderDialTimeout = 300 * time.Millisecond
	forwarderRetryAfter  = 30 * time.Second
)

// activityError maps the daemon client's errors to activity failures.
func activityError(err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		if ae.Kind == api.KindServerBusy || ae.Kind == api.KindShuttingDown {
			return apperr.Retryable(ae)
		}
		return apperr.New(ae)
	}
	var re *daemonclient.ResponseError
	if errors.As(err, &re) && !re.Transient() {
		return apperr.Newf(api.KindInternal, map[string]any{"status": re.Status}, "%v", re)
	}
	return err // unreachable daemon, or a server error that may pass: retryable
}

// resolveDaemon is the daemon client's Resolver: where Docker publishes the
// sandbox's daemon now.
func (a *Activities) resolveDaemon(ctx context.Context, sandboxID string) (api.Endpoint, error) {
	c, err := a.inspectContainer(ctx, sandboxID)
	if err != nil {
		return api.Endpoint{}, err
	}
	return daemonEndpoint(c), nil
}

// ResolveDaemon is the activity behind the sandbox workflow's
// resolve_daemon update: the daemon's endpoint as Docker publishes it now
// (a restarted container may listen on another host port), and whether the
// container runs.
func (a *Activities) ResolveDaemon(ctx context.Context, sandboxID string) (workflows.ContainerInfo, error) {
	if err := checkSandboxID(sandboxID); err != nil {
		return workflows.ContainerInfo{}, err
	}
	c, err := a.inspectContainer(ctx, sandboxID)
	if err != nil {
		return workflows.ContainerInfo{}, err
	}
	return containerInfo(c, sandboxID), nil
}

// WaitReady polls the daemon's /health with the token until it answers
// 200, heartbeating; it gives up when ctx ends, or early when the container
// stopped running, or Docker or the container's supervisor keeps
// restarting what cannot start.
func (a *Activities) WaitReady(ctx context.Context, sandboxID string, ep api.Endpoint) error {
	if err := checkSandboxID(sandboxID); err != nil {
		return err
	}
	if _, err := daemonclient.BaseURL(ep); err != nil {
		return activityError(err)
	}
	defer keepHeartbeating(ctx, heartbeatEvery, nil)()
	// A daemon is up some 50-100 ms after its container starts: poll
	// often at first, then back off.
	delay := 10 * time.Millisecond
	lastCheck := time.Now()
	var last error
	restarts := -1 // the container's restart count at the first check
	began := time.Now()
	for attempt := 1; ; attempt++ {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, last = a.daemon.Health(hctx, sandboxID, ep)
		cancel()
		if last == nil {
			a.log.Info("daemon ready", "sandbox_id", sandboxID, "port", ep.Port, "attempts", attempt)
			return nil
		}
		var ae *api.Error
		if errors.As(last, &ae) && ae.Kind == api.KindUnauthorized {
			return apperr.New(ae) // a daemon that refuses the token will go on refusing it
		}
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
			if restarts < 0 {
				restarts = c.RestartCount
			}
			// Docker restarts a container whose daemon exits (the restart
			// policy): one in its restart back-off, or restarted twice
			// while this waits, has a daemon that cannot start (a binary
			// the image cannot run, a bad flag). Waiting out the timeout
			// would only repeat it; its output says why.
			if c.State.Restarting || c.RestartCount >= restarts+2 {
				return a.restartLoop(ctx, sandboxID, c)
			}
			// Inside a running container the daemon's supervisor (PID 1)
			// restarts a daemon that exits, and says so in the output:
			// three times since this wait began is a daemon that cannot
			// start either (a state it cannot read, a bad flag).
			if n, said := a.supervisorRestarts(ctx, c.ID, began); n >= supervisorRestartsFatal {
				return apperr.Newf(api.KindOperationFailed, map[string]any{"sandbox_id": sandboxID, "container": strings.TrimPrefix(c.Name, "/"),
					"daemon_restarts": n},
					"daemon of sandbox %s cannot start: it exited %d times since the wait began, restarted each time by its container's supervisor; its last run said:\n%s",
					sandboxID, n, said)
			}
		}
		select {
		case <-ctx.Done():
			// The daemon's supervisor restarts a failing daemon inside a
			// running container, so its output is the only clue.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return fmt.Errorf("daemon of sandbox %s not ready at %s:%d: %w (last: %v)%s",
				sandboxID, ep.Host, ep.Port, ctx.Err(), last, a.logTail(lctx, workflows.ContainerName(sandboxID)))
		case <-time.After(delay):
		}
		delay = min(delay*3/2, 500*time.Millisecond)
	}
}

// supervisorRestartsFatal is how many daemon restarts by the supervisor
// during WaitReady end it (its back-off is 100, 200, 400 ms: about a
// second).
const supervisorRestartsFatal = 3

// supervisorRestarts counts the supervisor's restart lines in the
// container's output since since, and returns the first lines the daemon's
// last run wrote before it exited (where an error usually is: a Go panic,
// a refused flag before its usage text). 0 when the output cannot be read:
// the wait goes on as before.
func (a *Activities) supervisorRestarts(ctx context.Context, containerID string, since time.Time) (int, string) {
	rc, err := a.docker.ContainerLogs(ctx, containerID, container.LogsOptions{ShowStdout: true, ShowStderr: true,
		Since: strconv.FormatInt(since.Add(-time.Second).Unix(), 10)})
	if err != nil {
		return 0, ""
	}
	defer rc.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, io.LimitReader(rc, 1<<20)); err != nil && out.Len() == 0 {
		return 0, ""
	}
	const keep = 12
	n := 0
	var run, last []string
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		// The supervisor's own JSON line, read as JSON: text that merely
		// quotes it (a logged path, a command) is escaped inside a string.
		var rec struct{ Msg, Component string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == api.DaemonRestartLog && rec.Component == "pid1" {
			n++
			run, last = nil, append(run, line)
			continue
		}
		run = append(run, line)
	}
	if len(last) > keep+1 {
		last = append(append(last[:keep:keep], "…"), last[len(last)-1])
	}
	return n, strings.Join(last, "\n")
}

// restartLoop is the answer for a sandbox whose container Docker keeps
// restarting: its daemon cannot start, and the container's output says why.
// A container caught running between two restarts shows exit code 0 (Docker
// clears it at each start): the exit code is the one of a later inspect
// that finds it in its restart back-off or stopped, or is left out.
func (a *Activities) restartLoop(ctx context.Context, sandboxID string, c container.InspectResponse) error {
	exited := func(c container.InspectResponse) bool {
		return c.State != nil && (c.State.Restarting || !c.State.Running)
	}
	for deadline := time.Now().Add(restartLoopExitWait); !exited(c) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
		case <-time.After(25 * time.Millisecond):
		}
		if ctx.Err() != nil {
			break
		}
		if later, err := a.inspectContainer(ctx, sandboxID); err == nil {
			c = later
		}
	}
	name := strings.TrimPrefix(c.Name, "/")
	details := map[string]any{"sandbox_id": sandboxID, "container": name, "restart_count": c.RestartCount}
	how := fmt.Sprintf("%d restarts", c.RestartCount)
	if exited(c) {
		details["exit_code"] = c.State.ExitCode
		how = fmt.Sprintf("exit code %d, %s", c.State.ExitCode, how)
	}
	return apperr.Newf(api.KindOperationFailed, details, "daemon of sandbox %s cannot start: its container %s keeps exiting (%s)%s",
		sandboxID, name, how, a.logTail(ctx, c.ID))
}

// restartLoopExitWait bounds restartLoop's wait for a sight of the
// container between a daemon's exit and its next start (Docker's back-off
// is 100 ms, doubling).
var restartLoopExitWait = 2 * time.Second

// Pass does nothing. A sandbox workflow about to continue as new waits
// for it on its own queue (workflows' drain): the wait ends its workflow
// task, so the answers of its last updates are recorded before the
// continue-as-new command (a timer would do too, but the server's timer
// queue fires short timers up to a second late).
func (a *Activities) Pass(ctx context.Context) error { return nil }
