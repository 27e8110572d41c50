// Package sessinit is a workspace session's PID 1: it holds the session's
// namespaces, reaps orphans, and serves the daemon's fast exec path on the
// socket the runtime hands over (see package runtime, fastexec_linux.go).
// It defines the protocol. The init the product ships is its C
// counterpart, cmd/sandbox-sessinit/sessinit.c (one static binary, one
// thread: an idle session is that process, 64 KiB of anonymous memory
// where this Go init held about 580 KiB and 5 threads); this one runs, as
// the daemon binary's "sessinit", only where that binary is missing.
package sessinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// shutdownGrace is how long the session init waits after SIGTERM-ing every
// process before it SIGKILLs the rest.
const shutdownGrace = 2 * time.Second

// lingerFor bounds the wait for the daemon to hang up after the last reply.
const lingerFor = 10 * time.Second

// Main is the session's PID 1 (cmd/sandbox-sessinit, or the daemon binary
// as "sessinit" through runtime.SessionInitMain); exit with its result. It reaps every zombie in the
// session, serves the fast exec socket when the runtime handed one over,
// optionally starts args as a first child, and on SIGTERM or SIGINT
// terminates every other process of the session and returns 0.
func Main(args []string) int {
	// One P: the init forks, reaps and relays; it needs no parallelism, and
	// every P costs an idle session memory (caches, GC workers, threads).
	goruntime.GOMAXPROCS(1)
	_ = os.Unsetenv("GOMAXPROCS") // the daemon sets it for this process (before main), not for its children
	if os.Getpid() != 1 {
		// Its shutdown signals every process it can see (kill -1): run
		// anywhere but as a pid namespace's init, that is the whole machine.
		fmt.Fprintln(os.Stderr, "sessinit: refusing to run: not PID 1 of a session's pid namespace")
		return 2
	}
	// Before anything else: nothing of the session runs unfiltered.
	_, err := LoadHandedFilter()
	reportReady(err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessinit:", err)
		return 1
	}
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT)
	srv := NewServer()
	if v := os.Getenv(ExecFDEnv); v != "" {
		_ = os.Unsetenv(ExecFDEnv)
		if ln, err := fileListener(v); err != nil {
			fmt.Fprintln(os.Stderr, "sessinit: exec socket:", err)
		} else {
			go srv.serve(ln)
		}
	}
	if len(args) > 0 {
		if st, err := srv.start(Request{Args: args, Env: os.Environ(), Cwd: "/"}, []uintptr{0, 1, 2}); err != nil {
			fmt.Fprintln(os.Stderr, "sessinit:", err)
		} else if st.pidfd >= 0 {
			_ = unix.Close(st.pidfd)
		}
	}
	// SIGCHLDs coalesce and one may predate Notify: reap on a timer as well.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// An idle session is this process: hand the heap it no longer uses
	// back to the kernel after each burst of execs (not at start: a forced
	// GC then costs more than it returns).
	var freedAt int64
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
			if n := srv.served.Load(); n != freedAt && srv.busy.Load() == 0 {
				debug.FreeOSMemory()
				freedAt = n
			}
		}
	}
}

func fileListener(fdStr string) (*net.UnixListener, error) {
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return nil, fmt.Errorf("bad %s=%q", ExecFDEnv, fdStr)
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
func terminateAll(srv *Server) {
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

// NewServer returns an exec server with no children yet.
func NewServer() *Server { return &Server{waiters: make(map[int]chan int)} }

// Server forks processes for the daemon and reports their exit.
type Server struct {
	mu      sync.Mutex // held across fork and registration, so reap never misses a waiter
	waiters map[int]chan int

	busy, served atomic.Int64 // requests being handled; handled so far
}

// reap collects every exited child and hands exit codes to their waiters;
// it reports whether no children are left.
// Reap collects every exited child and hands exit codes to their waiters;
// it reports whether no children are left.
func (s *Server) Reap() bool { return s.reap() }

func (s *Server) reap() (none bool) {
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

// Serve answers exec requests on ln until it is closed.
func (s *Server) Serve(ln *net.UnixListener) { s.serve(ln) }

func (s *Server) serve(ln *net.UnixListener) {
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

// requestSize is the size of the next request on conn (one SOCK_SEQPACKET
// record), plus one byte so an oversized one shows, and at most
// MaxRequest+1: an idle init should not keep a 256 KiB buffer per exec
// in its heap.
func requestSize(conn *net.UnixConn) int {
	size := MaxRequest + 1
	rc, err := conn.SyscallConn()
	if err != nil {
		return size
	}
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		if errors.Is(err, unix.EAGAIN) {
			return false // wait until readable
		}
		if err == nil && n >= 0 && n < MaxRequest {
			size = n + 1
		}
		return true
	})
	return size
}

func (s *Server) handle(conn *net.UnixConn) {
	s.busy.Add(1)
	defer s.busy.Add(-1)
	s.served.Add(1)
	defer conn.Close()
	// The daemon hangs up once it has read the last reply; closing right
	// after sending it loses that reply now and then (the reader sees
	// EOF), so wait for the hang-up, a while at most.
	defer func() {
		_ = conn.SetReadDeadline(time.Now().Add(lingerFor))
		var b [1]byte
		_, _ = conn.Read(b[:])
	}()
	reply := func(r Reply, rights []byte) error {
		b, _ := json.Marshal(r)
		_, _, err := conn.WriteMsgUnix(b, rights, nil)
		return err
	}
	buf := make([]byte, requestSize(conn))
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		return
	}
	fds, err := ParseRights(oob[:oobn])
	defer func() { CloseFds(fds) }()
	if err != nil || len(fds) != 3 {
		_ = reply(Reply{Error: fmt.Sprintf("want 3 stdio fds, got %d (%v)", len(fds), err)}, nil)
		return
	}
	var req Request
	if err := json.Unmarshal(buf[:n], &req); err != nil || len(req.Args) == 0 {
		_ = reply(Reply{Error: fmt.Sprintf("bad request: %v", err)}, nil)
		return
	}
	ch, err := s.start(req, []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])})
	CloseFds(fds)
	fds = nil
	if err != nil {
		_ = reply(Reply{Error: err.Error()}, nil)
		return
	}
	var rights []byte
	if ch.pidfd >= 0 {
		defer unix.Close(ch.pidfd)
		rights = unix.UnixRights(ch.pidfd)
	}
	if err := reply(Reply{Pid: ch.pid}, rights); err != nil {
		// The daemon gave up on the start (it hung up): nobody would
		// watch or end this process, so it is ended now.
		_ = unix.Kill(-ch.pid, unix.SIGKILL)
		<-ch.exit
		return
	}
	code := <-ch.exit
	_ = reply(Reply{Exit: &code}, nil)
}

type started struct {
	pid   int
	pidfd int // from clone(CLONE_PIDFD): valid even if the child is reaped at once; -1 if none
	exit  chan int
}

// start forks req with the given stdio in a new session (setsid).
func (s *Server) start(req Request, stdio []uintptr) (started, error) {
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

// ExecFDEnv names the init's environment variable holding the listener fd.
const ExecFDEnv = "EOS_EXEC_FD"

// MaxRequest bounds one request (args and environment).
const MaxRequest = 256 << 10

// Request is one fast-path exec: the process's stdin, stdout and stderr
// come with it as SCM_RIGHTS.
type Request struct {
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Cwd  string   `json:"cwd"`
}

// Reply is either the start reply (Pid or Error) or the exit reply.
type Reply struct {
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
	Exit  *int   `json:"exit,omitempty"`
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

// ParseRights returns the descriptors of SCM_RIGHTS control messages.
func ParseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err == nil {
			fds = append(fds, r...)
		}
	}
	return fds, nil
}

// CloseFds closes fds.
func CloseFds(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
