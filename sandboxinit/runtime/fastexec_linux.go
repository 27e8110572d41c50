package runtime

// The fast exec path: the daemon creates a SOCK_SEQPACKET listener at
// Dir/exec.sock (outside the session, which cannot see Dir) and hands it to
// the session init as fd 3. Exec with ViaInit connects, sends one request
// with the process's stdin, stdout and stderr attached (SCM_RIGHTS), and
// the init forks the process (setsid) and answers twice on the same
// connection: once started (with a pidfd, from which the daemon reads the
// pid in its own pid namespace), once exited. The process inherits
// everything from the init: namespaces, root, cgroup, capabilities,
// no_new_privs, rlimits.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime/sessinit"
)

func execSocketPath(dir string) string { return filepath.Join(dir, "exec.sock") }

// shortPath calls fn with a path to p short enough for sun_path (108 bytes),
// going through /proc/self/fd of p's directory when needed.
func shortPath(p string, fn func(string) error) error {
	if len(p) < 100 {
		return fn(p)
	}
	d, err := os.OpenFile(filepath.Dir(p), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	return fn("/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + filepath.Base(p))
}

// listenExecSocket binds the exec socket and returns the listening fd as a
// file for the init; the daemon keeps no listener of its own.
func listenExecSocket(path string) (*os.File, error) {
	_ = os.Remove(path)
	var f *os.File
	err := shortPath(path, func(p string) error {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: p, Net: "unixpacket"})
		if err != nil {
			return err
		}
		ln.SetUnlinkOnClose(false)
		defer ln.Close()
		f, err = ln.File()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on exec socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("chmod exec socket: %w", err)
	}
	return f, nil
}

// execViaInit is Exec's fast path.
func (s *Session) execViaInit(ctx context.Context, ps ProcSpec, env []string) (*Proc, error) {
	if s.fastSock == "" {
		return nil, fmt.Errorf("exec in %s: %w: the session has no exec socket", s.spec.ID, ErrUnsupported)
	}
	var conn *net.UnixConn
	err := shortPath(s.fastSock, func(p string) error {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: p, Net: "unixpacket"})
		conn = c
		return err
	})
	if err != nil {
		if s.c != nil && !s.c.running() {
			return nil, fmt.Errorf("exec in %s: %w", s.spec.ID, ErrGone)
		}
		return nil, fmt.Errorf("exec in %s: dial session init: %w", s.spec.ID, err)
	}
	p, err := s.requestExec(ctx, conn, ps, env)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("exec in %s via init: %w", s.spec.ID, err)
	}
	return p, nil
}

func (s *Session) requestExec(ctx context.Context, conn *net.UnixConn, ps ProcSpec, env []string) (*Proc, error) {
	req, err := json.Marshal(execRequest{Args: ps.Args, Env: env, Cwd: ps.Cwd})
	if err != nil {
		return nil, err
	}
	if len(req) > maxExecRequest {
		return nil, fmt.Errorf("%w: request of %d bytes exceeds %d", ErrInvalidSpec, len(req), maxExecRequest)
	}
	sio, err := newStdio(ps, true)
	if err != nil {
		return nil, err
	}
	rights := unix.UnixRights(int(sio.child.stdin.Fd()), int(sio.child.stdout.Fd()), int(sio.child.stderr.Fd()))
	if _, _, err := conn.WriteMsgUnix(req, rights, nil); err != nil {
		sio.abort()
		return nil, fmt.Errorf("send request: %w", err)
	}
	sio.started()
	// An init that does not serve the socket (not SessionInitMain) would
	// leave us waiting: bound the start reply. Not by ctx: the init may
	// have started the process, which a reply not read would leave
	// running unwatched; a ctx that ends first kills it once it is ours
	// (run, as for any process).
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	rep, fds, err := readReply(conn)
	if err != nil {
		sio.abort()
		return nil, fmt.Errorf("read start reply: %w", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if rep.Error != "" {
		sio.abort()
		closeFds(fds)
		return nil, errors.New(rep.Error)
	}
	// rep.Pid is the session's view; signals and Pid need ours, which the
	// pidfd tells. Without it, fail rather than signal a stranger later.
	if len(fds) != 1 {
		closeFds(fds)
		sio.abort()
		return nil, fmt.Errorf("no pidfd for session pid %d (kernel without CLONE_PIDFD?)", rep.Pid)
	}
	pid, err := pidfdPid(fds[0])
	closeFds(fds)
	if err != nil {
		sio.abort()
		return nil, err
	}
	p := newProc(pid, sio)
	if pid <= 0 {
		// Already exited and reaped inside the session: there is nothing
		// left to signal; the exit reply is on its way.
		p.pid = 0
		p.reaped.Store(true)
	}
	go p.run(ctx, ps.WaitDelay, func() (int, error) {
		defer conn.Close()
		rep, fds, err := readReply(conn)
		closeFds(fds)
		if err != nil {
			return 0, fmt.Errorf("%w: lost the session init while waiting: %v", ErrGone, err)
		}
		if rep.Exit == nil {
			return 0, fmt.Errorf("unexpected reply from session init: %+v", rep)
		}
		return *rep.Exit, nil
	})
	return p, nil
}

func readReply(conn *net.UnixConn) (execReply, []int, error) {
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return execReply{}, nil, err
	}
	if n == 0 {
		return execReply{}, nil, errors.New("connection closed")
	}
	fds, err := parseRights(oob[:oobn])
	if err != nil {
		return execReply{}, nil, err
	}
	var rep execReply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		closeFds(fds)
		return execReply{}, nil, fmt.Errorf("decode reply: %w", err)
	}
	return rep, fds, nil
}

func parseRights(oob []byte) ([]int, error) { return sessinit.ParseRights(oob) }

func closeFds(fds []int) { sessinit.CloseFds(fds) }

// pidfdPid reads the pid a pidfd refers to, as seen from our pid namespace.
// One ioctl (PIDFD_GET_INFO, Linux 6.13) where the kernel has it, about
// 17 µs less per exec than fdinfo (measured); a process already reaped is
// -1, as fdinfo says it.
func pidfdPid(fd int) (int, error) {
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_PID}
	switch err := unix.IoctlPidfdInfo(fd, &info); {
	case err == nil && info.Mask&unix.PIDFD_INFO_PID != 0:
		return int(info.Pid), nil
	case errors.Is(err, unix.ESRCH):
		return -1, nil
	}
	return pidfdPidFdinfo(fd)
}

// pidfdPidFdinfo is pidfdPid through /proc/self/fdinfo (any kernel with
// pidfds).
func pidfdPidFdinfo(fd int) (int, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Pid in pidfd fdinfo")
}
