package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// shutdownGrace is how long the session init waits after SIGTERM-ing every
// process before it SIGKILLs the rest.
const shutdownGrace = 2 * time.Second

// SessionInitMain is the session's PID 1; the daemon's main dispatches
// "sessinit" to it and exits with its result. It reaps every zombie in the
// session, serves the fast exec socket when the runtime handed one over,
// optionally starts args as a first child, and on SIGTERM or SIGINT
// terminates every other process of the session and returns 0.
func SessionInitMain(args []string) int {
	if os.Getpid() != 1 {
		// Its shutdown signals every process it can see (kill -1): run
		// anywhere but as a pid namespace's init, that is the whole machine.
		fmt.Fprintln(os.Stderr, "sessinit: refusing to run: not PID 1 of a session's pid namespace")
		return 2
	}
	// Before anything else: nothing of the session runs unfiltered.
	_, err := loadHandedFilter()
	reportReady(err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessinit:", err)
		return 1
	}
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT)
	srv := &execServer{waiters: make(map[int]chan int)}
	if v := os.Getenv(execFDEnv); v != "" {
		_ = os.Unsetenv(execFDEnv)
		if ln, err := fileListener(v); err != nil {
			fmt.Fprintln(os.Stderr, "sessinit: exec socket:", err)
		} else {
			go srv.serve(ln)
		}
	}
	if len(args) > 0 {
		if st, err := srv.start(execRequest{Args: args, Env: os.Environ(), Cwd: "/"}, []uintptr{0, 1, 2}); err != nil {
			fmt.Fprintln(os.Stderr, "sessinit:", err)
		} else if st.pidfd >= 0 {
			_ = unix.Close(st.pidfd)
		}
	}
	// SIGCHLDs coalesce and one may predate Notify: reap on a timer as well.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case sig := <-sigs:
			srv.reap()
			if sig == unix.SIGTERM || sig == unix.SIGINT {
				terminateAll(srv)
				return 0
			}
		case <-tick.C:
			srv.reap()
		}
	}
}

func fileListener(fdStr string) (*net.UnixListener, error) {
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return nil, fmt.Errorf("bad %s=%q", execFDEnv, fdStr)
	}
	f := os.NewFile(uintptr(fd), "exec.sock")
	defer f.Close() // FileListener dups it (close-on-exec)
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		_ = ln.Close()
		return nil, fmt.Errorf("fd %d is not a unix socket", fd)
	}
	return ul, nil
}

// terminateAll sends SIGTERM to every process of the pid namespace, waits
// up to shutdownGrace for them to go, then SIGKILLs what is left. Processes
// entered through libcontainer are the daemon's children, not ours, so
// "gone" is judged from /proc, not from wait.
func terminateAll(srv *execServer) {
	_ = unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(shutdownGrace)
	for time.Now().Before(deadline) {
		srv.reap()
		if !othersAlive() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = unix.Kill(-1, unix.SIGKILL)
	for !srv.reap() {
		time.Sleep(5 * time.Millisecond)
	}
}

// othersAlive reports whether a process other than this one (PID 1) is
// running, zombies aside, in the session's pid namespace.
func othersAlive() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// The state follows the parenthesised command name, which may hold spaces.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && b[i+2] != 'Z' {
			return true
		}
	}
	return false
}

// execServer forks processes for the daemon and reports their exit.
type execServer struct {
	mu      sync.Mutex // held across fork and registration, so reap never misses a waiter
	waiters map[int]chan int
}

// reap collects every exited child and hands exit codes to their waiters;
// it reports whether no children are left.
func (s *execServer) reap() (none bool) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ECHILD) {
			return true
		}
		if pid <= 0 || err != nil {
			return false
		}
		code := ws.ExitStatus()
		if ws.Signaled() {
			code = -int(ws.Signal())
		}
		s.mu.Lock()
		ch := s.waiters[pid]
		delete(s.waiters, pid)
		s.mu.Unlock()
		if ch != nil {
			ch <- code
		}
	}
}

func (s *execServer) serve(ln *net.UnixListener) {
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.handle(conn)
	}
}

func (s *execServer) handle(conn *net.UnixConn) {
	defer conn.Close()
	reply := func(r execReply, rights []byte) {
		b, _ := json.Marshal(r)
		_, _, _ = conn.WriteMsgUnix(b, rights, nil)
	}
	buf := make([]byte, maxExecRequest+1)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		return
	}
	fds, err := parseRights(oob[:oobn])
	defer func() { closeFds(fds) }()
	if err != nil || len(fds) != 3 {
		reply(execReply{Error: fmt.Sprintf("want 3 stdio fds, got %d (%v)", len(fds), err)}, nil)
		return
	}
	var req execRequest
	if err := json.Unmarshal(buf[:n], &req); err != nil || len(req.Args) == 0 {
		reply(execReply{Error: fmt.Sprintf("bad request: %v", err)}, nil)
		return
	}
	ch, err := s.start(req, []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])})
	closeFds(fds)
	fds = nil
	if err != nil {
		reply(execReply{Error: err.Error()}, nil)
		return
	}
	var rights []byte
	if ch.pidfd >= 0 {
		defer unix.Close(ch.pidfd)
		rights = unix.UnixRights(ch.pidfd)
	}
	reply(execReply{Pid: ch.pid}, rights)
	code := <-ch.exit
	reply(execReply{Exit: &code}, nil)
}

type started struct {
	pid   int
	pidfd int // from clone(CLONE_PIDFD): valid even if the child is reaped at once; -1 if none
	exit  chan int
}

// start forks req with the given stdio in a new session (setsid).
func (s *execServer) start(req execRequest, stdio []uintptr) (started, error) {
	path, err := lookPath(req.Args[0], req.Env, req.Cwd)
	if err != nil {
		return started{}, err
	}
	pidfd := -1
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, err := syscall.ForkExec(path, req.Args, &syscall.ProcAttr{
		Dir: req.Cwd, Env: req.Env, Files: stdio,
		Sys: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd},
	})
	if err != nil {
		return started{}, fmt.Errorf("start %s: %w", req.Args[0], err)
	}
	ch := make(chan int, 1)
	s.waiters[pid] = ch
	return started{pid: pid, pidfd: pidfd, exit: ch}, nil
}

// lookPath resolves name like a shell would, with the request's PATH.
func lookPath(name string, env []string, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = cwd
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: executable file not found in $PATH", name)
}
