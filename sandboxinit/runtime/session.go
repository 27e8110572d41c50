package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// Session is a running session. Its methods are safe for concurrent use.
type Session struct {
	r    *Runtime
	spec SessionSpec
	dirs rootDirs
	ip   string

	c        *container
	initDone chan struct{} // closed when the init this process started exited; nil after Load
	fastSock string        // the session init's exec socket, "" when there is none

	mu        sync.Mutex
	destroyed bool
	frozen    int // nested Freeze calls not thawed yet
}

// ErrFreezeUnkillable: freezing is refused on cgroup v1. The v1 freezer
// holds frozen tasks even against SIGKILL, so a sandbox container killed
// (docker kill, an OOM of its daemon) while a session is frozen could not
// exit until someone thawed it by hand; v2's cgroup.freeze lets fatal
// signals through. Captures stay safe without it: every read of a session's
// files goes by descriptors beneath its upper dir.
var ErrFreezeUnkillable = errors.New("freezing a session is not done on cgroup v1: its frozen tasks could not be killed")

// Freeze pauses every process of the session (libcontainer's Pause:
// cgroup.freeze on cgroup v2; refused with ErrFreezeUnkillable on v1)
// until the returned thaw runs, so they cannot change the upper dir while
// the daemon captures it. Freezes nest: the session thaws when the last
// thaw has run. thaw is idempotent; run it on every path (defer). Destroy
// thaws first.
func (s *Session) Freeze() (thaw func(), err error) {
	if !cgroups.IsCgroup2UnifiedMode() {
		return nil, ErrFreezeUnkillable
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed || s.c == nil {
		return nil, fmt.Errorf("freeze %s: %w", s.spec.ID, ErrGone)
	}
	if s.frozen == 0 {
		if err := s.c.pause(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.spec.ID, err)
		}
	}
	s.frozen++
	var once sync.Once
	return func() { once.Do(s.thaw) }, nil
}

func (s *Session) thaw() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.frozen == 0 {
		return // Destroy thawed it
	}
	s.frozen--
	if s.frozen == 0 && !s.destroyed {
		if err := s.c.resume(); err != nil {
			s.r.log.Error("thaw session", "session_id", s.spec.ID, "err", err)
		}
	}
}

// Frozen reports whether the session's processes are frozen now.
func (s *Session) Frozen() bool {
	if err := s.alive(); err != nil {
		return false
	}
	return s.c.paused()
}

// ID returns the session's id.
func (s *Session) ID() string { return s.spec.ID }

// IP returns the address an isolated session is reachable on from the
// sandbox (the daemon, shared-network sessions); other isolated sessions
// never reach it (firewall.go). It is "" for a session that shares the
// sandbox's network.
func (s *Session) IP() string { return s.ip }

// InitPid returns the pid of the session's init in the sandbox's pid
// namespace.
func (s *Session) InitPid() (int, error) {
	if err := s.alive(); err != nil {
		return 0, err
	}
	return s.c.initPid()
}

// Pids lists the session's processes (pids in the sandbox's pid namespace).
func (s *Session) Pids() ([]int, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	return s.c.pids()
}

// CgroupPaths maps each cgroup controller (v1) or "" (v2) to the session's
// cgroup dir, for collectors and tests.
func (s *Session) CgroupPaths() (map[string]string, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	return s.c.cgroupPaths()
}

func (s *Session) alive() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed || s.c == nil {
		return fmt.Errorf("session %s: %w", s.spec.ID, ErrGone)
	}
	return nil
}

// defaultEnv is the environment every session process starts from.
var defaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
}

// mergeEnv returns base overridden by each "K=V" of over, in order.
func mergeEnv(base []string, over ...[]string) []string {
	out := append([]string(nil), base...)
	for _, list := range over {
		for _, kv := range list {
			k := kv
			if i := strings.IndexByte(kv, '='); i >= 0 {
				k = kv[:i]
			}
			replaced := false
			for j, old := range out {
				if i := strings.IndexByte(old, '='); i >= 0 && old[:i] == k {
					out[j], replaced = kv, true
					break
				}
			}
			if !replaced {
				out = append(out, kv)
			}
		}
	}
	return out
}

// startInit runs the session's PID 1 with stdout and stderr appended to
// Dir/init.log and, as fd 3, the listening exec socket (see fastexec.go).
// With the precompiled filter (seccompload_linux.go) the init is started
// from InitPath opened in the sandbox (fd 5), is handed the filter (fd 4)
// and a pipe (fd 6), and startInit returns once the init reported the
// filter loaded and the kernel shows it.
func (s *Session) startInit(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(s.spec.Dir, "init.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("open init log: %w", err)
	}
	defer logf.Close()
	sockPath := execSocketPath(s.spec.Dir)
	ln, err := listenExecSocket(sockPath)
	if err != nil {
		return err
	}
	defer ln.Close() // the init holds its own copy
	args := append([]string{s.spec.InitPath}, s.spec.InitArgs...)
	// GOMAXPROCS=1 from the start: every P the Go runtime sets up before
	// main (threads, caches) is memory an idle session keeps.
	env := mergeEnv(defaultEnv, s.spec.Env, []string{execFDEnv + "=3", "GOMAXPROCS=1"})
	extra := []*os.File{ln}
	var readyR *os.File
	if s.c.preloaded() {
		exe, err := os.OpenFile(s.spec.InitPath, os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open init: %w", err)
		}
		defer exe.Close()
		r, w, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("init ready pipe: %w", err)
		}
		readyR = r
		defer readyR.Close()
		defer w.Close() // after run: the init holds its copy
		extra = append(extra, s.r.seccomp.compiled, exe, w)
		args[0] = "/proc/self/fd/5"
		env = append(env, seccompFDEnv+"=4", exeFDEnv+"=5", readyFDEnv+"=6")
	}
	p, err := s.c.run(procArgs{args: args, env: env, cwd: "/", io: procIO{
		stdout: logf, stderr: logf, extra: extra,
	}}, true)
	if err != nil {
		return err
	}
	s.fastSock = sockPath
	s.initDone = make(chan struct{})
	go func() {
		code, err := p.wait()
		s.r.log.Info("session init exited", "session_id", s.spec.ID, "exit_code", code, "err", err)
		close(s.initDone)
	}()
	if readyR != nil {
		extra[len(extra)-1].Close() // our write end: EOF when the init dies before reporting
		return s.awaitFiltered(ctx, readyR, p.pid)
	}
	return nil
}

// initReadyTimeout bounds the wait for a session init's report.
const initReadyTimeout = 30 * time.Second

// awaitFiltered waits for the init's report on r and checks that the kernel
// runs pid under one seccomp filter more than the daemon (the sandbox's,
// then the session's).
func (s *Session) awaitFiltered(ctx context.Context, r *os.File, pid int) error {
	_ = r.SetReadDeadline(time.Now().Add(initReadyTimeout))
	if dl, ok := ctx.Deadline(); ok {
		_ = r.SetReadDeadline(dl)
	}
	buf := make([]byte, 512)
	n, err := io.ReadAtLeast(r, buf, 1)
	msg := strings.TrimSpace(string(buf[:n]))
	if msg != "ok" {
		if msg == "" {
			msg = fmt.Sprint(err)
		}
		return fmt.Errorf("session init did not load its seccomp filter: %s", msg)
	}
	own, err := seccompFilters("self")
	if err != nil {
		return fmt.Errorf("seccomp filters of the daemon: %w", err)
	}
	theirs, err := seccompFilters(strconv.Itoa(pid))
	if err != nil {
		return fmt.Errorf("seccomp filters of the session init: %w", err)
	}
	if own >= 0 && theirs <= own {
		return fmt.Errorf("session init runs under %d seccomp filters, the daemon under %d: its own is missing", theirs, own)
	}
	return nil
}

// Destroy kills every process of the session, removes its container and
// cgroup, unmounts its root overlay and deletes its veth pair. The session's
// upper dir stays. Destroy is idempotent.
func (s *Session) Destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return nil
	}
	if err := s.teardown(ctx); err != nil {
		return fmt.Errorf("destroy %s: %w", s.spec.ID, err)
	}
	s.destroyed = true
	s.r.log.Info("session destroyed", "session_id", s.spec.ID)
	return nil
}

// Kill ends every process of the session and returns once they are gone:
// its init is killed, and with it every process in its pid namespace (the
// kernel kills them all before the init's exit completes). The container,
// cgroup, root overlay and network stay for Destroy. Kill is idempotent.
func (s *Session) Kill(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed || s.c == nil {
		return nil
	}
	if thawErr, err := s.killLocked(ctx); err != nil {
		return fmt.Errorf("kill %s: %w", s.spec.ID, errors.Join(thawErr, err))
	}
	return nil
}

// killLocked kills the init and waits for it to be gone (err); thawErr is a
// failure to thaw a paused session first, after which the kill goes on.
func (s *Session) killLocked(ctx context.Context) (thawErr, err error) {
	// A frozen process does not die of SIGKILL until thawed. Only Freeze
	// freezes a session (a loaded one left frozen is thawed by
	// loadContainer), so the count says whether it is: no status read of
	// the container (its init's /proc entry and freezer state) per kill.
	if s.frozen > 0 {
		thawErr = s.c.resume()
	}
	s.frozen = 0
	if err := s.c.kill(); err != nil {
		return thawErr, err
	}
	return thawErr, s.waitInitGone(ctx)
}

// teardown removes whatever part of the session exists; every step tolerates
// the part being gone.
func (s *Session) teardown(ctx context.Context) error {
	var errs []error
	if s.c != nil {
		thawErr, err := s.killLocked(ctx)
		if thawErr != nil {
			errs = append(errs, thawErr)
		}
		if err != nil {
			errs = append(errs, err)
		} else if err := s.c.destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountRoot(s.dirs); err != nil {
		errs = append(errs, err)
	}
	if s.spec.Isolated {
		s.r.stopSessionDNS(s.spec.ID)
		if err := deleteVeth(s.spec.ID); err != nil {
			errs = append(errs, err)
		}
		s.r.detachNetns(s.spec.ID)
		if s.r.fwErr == nil {
			if err := deleteEgress(s.spec.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.Remove(execSocketPath(s.spec.Dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// waitInitGone waits until the killed init has exited. A loaded session's
// init is not our os/exec child any more, so poll its state, and reap it if
// the daemon (restarted in place as PID 1) is still its parent.
func (s *Session) waitInitGone(ctx context.Context) error {
	if s.initDone != nil {
		select {
		case <-s.initDone:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("wait for session init to exit: %w", ctx.Err())
		}
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.c.running() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("wait for session init to exit: %w", ctx.Err())
		}
	}
	if pid, ok := s.c.initZombie(); ok {
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil) // ECHILD when the daemon is not its parent
	}
	return nil
}
