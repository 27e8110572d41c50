package sessinit_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime/sessinit"
)

// The session init every idle session is (cmd/sandbox-sessinit, C), run
// as PID 1 of a pid namespace of its own, on this machine: the daemon's
// protocol (a request and its stdio, a pid and a pidfd, the exit), and
// what it does with requests a stranger might send.

var cinit struct {
	once sync.Once
	path string
	err  error
}

func cinitBinary(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a pid namespace)")
	}
	cinit.once.Do(func() {
		dir, err := os.MkdirTemp("", "eos-sessinit-")
		if err != nil {
			cinit.err = err
			return
		}
		cinit.path = filepath.Join(dir, "sandbox-sessinit")
		cinit.err = testenv.BuildSessinit(cinit.path)
	})
	require.NoError(t, cinit.err)
	return cinit.path
}

type initProc struct {
	cmd  *exec.Cmd
	sock string
	done chan error
}

// startInit starts the init as PID 1 of a new pid namespace, serving an
// exec socket of its own. jailed, it runs chrooted in an empty directory
// (but for itself): nothing a request names can be found there.
func startInit(t testing.TB, jailed bool) *initProc {
	t.Helper()
	return startInitIgnoring(t, jailed, "")
}

// startInitIgnoring starts the init with the signals named in ignore (a
// shell's trap list, "" for none) ignored, as it would be if whatever
// started the sandbox's daemon had ignored them: a shell execs the init, so
// the init is still PID 1 and inherits SIG_IGN.
func startInitIgnoring(t testing.TB, jailed bool, ignore string) *initProc {
	t.Helper()
	bin := cinitBinary(t)
	dir := t.TempDir()
	var jail string
	if jailed {
		jail = t.TempDir()
		b, err := os.ReadFile(bin)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(jail, "init"), b, 0o755))
		bin = "/init"
	}
	sock := filepath.Join(dir, "exec.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	require.NoError(t, err)
	ln.Close()
	cmd := exec.Command(bin)
	if ignore != "" {
		require.False(t, jailed, "the jail has no shell")
		cmd = exec.Command("/bin/sh", "-c", `trap "" `+ignore+`; exec "$0"`, bin)
	}
	cmd.Env = []string{"EOS_EXEC_FD=3", "PATH=/usr/bin:/bin"}
	cmd.ExtraFiles = []*os.File{lf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Chroot: jail}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lf.Close()
	p := &initProc{cmd: cmd, sock: sock, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("init stderr: %s", stderr.String())
		}
	})
	return p
}

type reply struct {
	Pid   int    `json:"pid"`
	Error string `json:"error"`
	Exit  *int   `json:"exit"`
}

func readReply(t testing.TB, c *net.UnixConn) (reply, []int) {
	t.Helper()
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*4))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	require.NoError(t, err)
	require.NotZero(t, n, "the init closed the connection without an answer")
	fds, err := sessinit.ParseRights(oob[:oobn])
	require.NoError(t, err)
	var r reply
	require.NoError(t, json.Unmarshal(buf[:n], &r), "%q", buf[:n])
	return r, fds
}

// send sends raw with nfds descriptors (the write end of one pipe, whose
// read end it returns, as stdout and stderr; /dev/null as stdin).
func (p *initProc) send(t testing.TB, raw []byte, nfds int) (*net.UnixConn, *os.File) {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: p.sock, Net: "unixpacket"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer null.Close()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer w.Close()
	all := []int{int(null.Fd()), int(w.Fd()), int(w.Fd()), int(w.Fd())}
	var rights []byte
	if nfds > 0 {
		rights = unix.UnixRights(all[:nfds]...)
	}
	if len(raw) > 100<<10 { // a record this big needs a bigger send buffer
		rc, err := c.SyscallConn()
		require.NoError(t, err)
		require.NoError(t, rc.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20)
		}))
		require.NoError(t, err)
	}
	_, _, err = c.WriteMsgUnix(raw, rights, nil)
	require.NoError(t, err)
	return c, r
}

func request(args []string, env []string, cwd string) []byte {
	b, _ := json.Marshal(sessinit.Request{Args: args, Env: env, Cwd: cwd})
	return b
}

// run sends a request the init starts, and returns the process's exit
// and what it wrote (up to 256 bytes).
func (p *initProc) run(t testing.TB, raw []byte) (int, string) {
	t.Helper()
	c, out := p.send(t, raw, 3)
	r, fds := readReply(t, c)
	require.Empty(t, r.Error)
	require.Positive(t, r.Pid)
	for _, fd := range fds {
		unix.Close(fd)
	}
	r, _ = readReply(t, c)
	require.NotNil(t, r.Exit)
	b := make([]byte, 256)
	n, _ := out.Read(b)
	return *r.Exit, string(b[:n])
}

func TestCInitRunsRequests(t *testing.T) {
	p := startInit(t, false)
	c, out := p.send(t, request([]string{"sh", "-c", `echo "$1|$X|$(pwd)|$$"; exit 7`, "sh", "hé \"q\" \u003c"}, []string{"X=1", "PATH=/usr/bin:/bin"}, "/tmp"), 3)
	r, fds := readReply(t, c)
	require.Empty(t, r.Error)
	require.Positive(t, r.Pid)
	require.Len(t, fds, 1, "a pidfd with the start reply")
	unix.Close(fds[0])
	r, _ = readReply(t, c)
	require.NotNil(t, r.Exit)
	require.Equal(t, 7, *r.Exit)
	b := make([]byte, 256)
	n, _ := out.Read(b)
	fields := strings.Split(strings.TrimSpace(string(b[:n])), "|")
	require.Equal(t, []string{"hé \"q\" <", "1", "/tmp"}, fields[:3], "args, env and cwd as sent")
	require.NotEqual(t, "1", fields[3], "the process is not the init")

	// Killed by a signal: -signal.
	code, _ := p.run(t, request([]string{"sh", "-c", "kill -9 $$"}, nil, ""))
	require.Equal(t, -9, code)

	// Its signals are its own: none is blocked for it (the init blocks
	// SIGCHLD, SIGTERM, SIGINT and SIGPIPE for itself).
	code, sig := p.run(t, request([]string{"sh", "-c", "grep -E '^SigBlk' /proc/self/status"}, nil, ""))
	require.Equal(t, 0, code)
	require.Contains(t, sig, "SigBlk:\t0000000000000000")
}

// TestCInitCommandsStartWithDefaultSignals: signals the init was started
// with ignored are at their defaults in its commands (else ^C, a trap on INT
// or a hangup would not work in any session of such a daemon); a signal the
// init merely blocks stays unblocked for them; and an inherited SIG_IGN on
// SIGCHLD does not cost the init its commands' exit codes.
func TestCInitCommandsStartWithDefaultSignals(t *testing.T) {
	sigs := []unix.Signal{unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGUSR1, unix.SIGPIPE, unix.SIGTERM, unix.SIGTTOU, unix.SIGCHLD}
	p := startInitIgnoring(t, false, "HUP INT QUIT USR1 PIPE TERM TTOU CHLD")
	sigIgn := func(status string) uint64 {
		t.Helper()
		for _, l := range strings.Split(status, "\n") {
			if v, ok := strings.CutPrefix(l, "SigIgn:\t"); ok {
				m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				require.NoError(t, err)
				return m
			}
		}
		t.Fatalf("no SigIgn in %q", status)
		return 0
	}
	// What startInitIgnoring's shell does hands SIG_IGN on through exec.
	b, err := exec.Command("/bin/sh", "-c", `trap "" USR1; exec grep ^SigIgn /proc/self/status`).Output()
	require.NoError(t, err)
	require.NotZero(t, sigIgn(string(b))&(1<<(unix.SIGUSR1-1)), "the setup ignores: %s", b)

	code, out := p.run(t, request([]string{"sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"}, nil, ""))
	require.Equal(t, 0, code)
	// The init answered, so the shell has exec'd it.
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(t, err)
	require.Zero(t, sigIgn(string(st))&(1<<(unix.SIGUSR1-1)), "the init set what it was started with ignored back to its default")
	ign := sigIgn(out)
	for _, s := range sigs {
		require.Zero(t, ign&(1<<(s-1)), "%v is at its default in the command: %s", s, out)
	}
	require.Contains(t, out, "SigBlk:\t0000000000000000")

	// And it acts on them: a trap on INT runs, a hangup ends the process.
	code, out = p.run(t, request([]string{"sh", "-c", "trap 'echo INT; exit 3' INT; kill -INT $$; sleep 5"}, nil, ""))
	require.Equal(t, 3, code, out)
	require.Equal(t, "INT\n", out)
	code, _ = p.run(t, request([]string{"sh", "-c", "kill -HUP $$; sleep 5"}, nil, ""))
	require.Equal(t, -int(unix.SIGHUP), code)
}

func TestCInitRefusesBadRequests(t *testing.T) {
	p := startInit(t, false)
	deep := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	for _, tc := range []struct {
		name string
		raw  string
		nfds int
		want string
	}{
		{"no fds", string(request([]string{"true"}, nil, "")), 0, "want 3 stdio fds, got 0"},
		{"two fds", string(request([]string{"true"}, nil, "")), 2, "want 3 stdio fds, got 2"},
		{"four fds", string(request([]string{"true"}, nil, "")), 4, "want 3 stdio fds"},
		{"not json", "hello", 3, "bad request"},
		{"not an object", `["true"]`, 3, "bad request"},
		{"no args", `{"env":["A=1"]}`, 3, "bad request: no args"},
		{"args null", `{"args":null}`, 3, "bad request: no args"},
		{"args not strings", `{"args":[1,2]}`, 3, "bad request"},
		{"unterminated", `{"args":["tru`, 3, "bad request"},
		{"bad escape", `{"args":["\x"]}`, 3, "bad request"},
		{"short unicode escape", `{"args":["\u12"]}`, 3, "bad request"},
		{"raw control character", "{\"args\":[\"a\nb\"]}", 3, "bad request"},
		{"trailing data", `{"args":["true"]} {}`, 3, "bad request"},
		{"nested too deep", `{"x":` + deep + `,"args":["true"]}`, 3, "bad request"},
		{"NUL in an arg", `{"args":["true","a\u0000b"]}`, 3, "invalid argument"},
		{"NUL in the env", `{"args":["true"],"env":["A=\u0000"]}`, 3, "invalid argument"},
		{"not found", string(request([]string{"no-such-command-here"}, []string{"PATH=/nonexistent"}, "")), 3, "no-such-command-here: executable file not found in $PATH"},
		{"not executable", string(request([]string{"/etc/passwd"}, nil, "")), 3, "start /etc/passwd: permission denied"},
		{"bad cwd", string(request([]string{"true"}, nil, "/nonexistent/dir")), 3, "start true: no such file or directory"},
		{"oversized", `{"args":["true"],"pad":"` + strings.Repeat("a", sessinit.MaxRequest) + `"}`, 3, "bad request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := p.send(t, []byte(tc.raw), tc.nfds)
			r, fds := readReply(t, c)
			require.Empty(t, fds)
			require.Contains(t, r.Error, tc.want)
			require.Zero(t, r.Pid)
		})
	}
	// Unknown fields are ignored, escapes decoded, as Go reads them; and
	// the init still serves after all of that.
	code, out := p.run(t, []byte(`{"x":{"a":[1,-2.5e3,true,false,null,"s"]},"args":["sh","-c","echo \"$1\"","sh","\ud83d\ude00 \ud800"],"cwd":null}`))
	require.Equal(t, 0, code)
	require.Equal(t, "😀 \ufffd\n", out)
}

func TestCInitRefusesToRunButAsPID1(t *testing.T) {
	out, err := exec.Command(cinitBinary(t)).CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 2, ee.ExitCode())
	require.Contains(t, string(out), "not PID 1")
}

// SIGTERM: every other process is terminated (a SIGTERM-ignoring one
// SIGKILLed after the grace), each waiting connection gets its exit, and
// the init exits 0.
func TestCInitShutdown(t *testing.T) {
	p := startInit(t, false)
	var conns []*net.UnixConn
	for _, script := range []string{"sleep 100", "trap '' TERM; sleep 100 & wait"} {
		c, _ := p.send(t, request([]string{"sh", "-c", script}, nil, ""), 3)
		r, fds := readReply(t, c)
		require.Empty(t, r.Error)
		for _, fd := range fds {
			unix.Close(fd)
		}
		conns = append(conns, c)
	}
	time.Sleep(100 * time.Millisecond) // the trap is set
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.done:
		require.NoError(t, err)
		p.done <- err
	case <-time.After(30 * time.Second):
		t.Fatal("the init did not exit after SIGTERM")
	}
	for i, c := range conns {
		r, _ := readReply(t, c)
		require.NotNil(t, r.Exit, "connection %d", i)
	}
}

// The seccomp filter: loaded before anything runs (its processes are
// under it), reported on the ready fd; a malformed one is refused and
// reported, and nothing is served.
func TestCInitLoadsTheHandedFilter(t *testing.T) {
	// A filter that allows everything but uname (EPERM).
	allowAll := &sessinit.Filter{Prog: []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_UNAME, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}}
	for _, tc := range []struct {
		name  string
		data  []byte
		ready string
	}{
		{"a filter", allowAll.Encode(), "ok\n"},
		{"not a filter", []byte("garbage"), "error: not a compiled seccomp filter\n"},
		{"wrong count", append(allowAll.Encode(), 0), "error: compiled seccomp filter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, sock, rd, done := startInitWithFilter(t, tc.data)
			msg := make([]byte, 256)
			_ = rd.SetReadDeadline(time.Now().Add(20 * time.Second))
			n, _ := rd.Read(msg)
			require.Contains(t, string(msg[:n]), tc.ready)
			if tc.ready != "ok\n" {
				select {
				case err := <-done:
					var ee *exec.ExitError
					require.ErrorAs(t, err, &ee)
					require.Equal(t, 1, ee.ExitCode())
					done <- err
				case <-time.After(20 * time.Second):
					t.Fatal("the init went on with a bad filter")
				}
				return
			}
			p := &initProc{cmd: cmd, sock: sock, done: done}
			code, out := p.run(t, request([]string{"sh", "-c", "uname >/dev/null 2>&1 || echo refused; grep Seccomp: /proc/self/status"}, nil, ""))
			require.Equal(t, 0, code)
			require.Contains(t, out, "refused", "the command runs under the init's filter")
			require.Contains(t, out, "Seccomp:\t2")
			pid := strconv.Itoa(cmd.Process.Pid)
			f, err := sessinit.SeccompFilters(pid)
			require.NoError(t, err)
			require.Equal(t, 1, f, "the init itself runs under the filter")
		})
	}
}

// startInitWithFilter starts the C init with data as its seccomp filter
// (fd 4), its exec socket (at sock) on fd 3 and its ready fd 5, which rd
// reads.
func startInitWithFilter(t *testing.T, data []byte) (cmd *exec.Cmd, sock string, rd *os.File, done chan error) {
	t.Helper()
	mf, err := os.CreateTemp(t.TempDir(), "filter")
	require.NoError(t, err)
	_, err = mf.Write(data)
	require.NoError(t, err)
	rd, wr, err := os.Pipe()
	require.NoError(t, err)
	bin := cinitBinary(t)
	sock = filepath.Join(t.TempDir(), "exec.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	lf, _ := ln.File()
	ln.Close()
	cmd = exec.Command(bin)
	cmd.Env = []string{"EOS_EXEC_FD=3", "EOS_SECCOMP_FD=4", "EOS_READY_FD=5", "PATH=/usr/bin:/bin"}
	cmd.ExtraFiles = []*os.File{lf, mf, wr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	require.NoError(t, cmd.Start())
	lf.Close()
	mf.Close()
	wr.Close()
	done = make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return cmd, sock, rd, done
}

// The init starts each command in its own memory until execve (CLONE_VM |
// CLONE_VFORK, as posix_spawn), and falls back to fork where clone refuses
// that (an old kernel, a stricter filter): under a filter that refuses a
// plain fork, commands still run (the first way is taken); under one that
// refuses CLONE_VFORK, they run too (the fallback), and a child's failure
// before execve is reported either way.
func TestCInitStartsCommandsWithoutCopyingItself(t *testing.T) {
	// clone with the flag bit (in the low word of args[0]) set, or not
	// set: EPERM; everything else allowed.
	refuseClone := func(bit uint32, whenSet bool) []byte {
		jt, jf := uint8(0), uint8(1) // when set: to EPERM
		if !whenSet {
			jt, jf = 1, 0
		}
		return (&sessinit.Filter{Prog: []unix.SockFilter{
			{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},
			{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_CLONE, Jt: 0, Jf: 3},
			{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 16},
			{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, K: bit, Jt: jt, Jf: jf},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		}}).Encode()
	}
	for _, tc := range []struct {
		name   string
		filter []byte
	}{
		{"fork refused", refuseClone(unix.CLONE_VM, false)},
		{"CLONE_VFORK refused", refuseClone(unix.CLONE_VFORK, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, sock, rd, done := startInitWithFilter(t, tc.filter)
			msg := make([]byte, 64)
			_ = rd.SetReadDeadline(time.Now().Add(20 * time.Second))
			n, _ := rd.Read(msg)
			require.Equal(t, "ok\n", string(msg[:n]))
			p := &initProc{cmd: cmd, sock: sock, done: done}
			for i := 0; i < 3; i++ {
				code, out := p.run(t, request([]string{"sh", "-c", "echo ran; exit 3"}, nil, "/tmp"))
				require.Equal(t, 3, code)
				require.Equal(t, "ran\n", out)
			}
			c, _ := p.send(t, request([]string{"true"}, nil, "/nonexistent/dir"), 3)
			r, fds := readReply(t, c)
			require.Empty(t, fds)
			require.Contains(t, r.Error, "start true: no such file or directory")
		})
	}
}

// FuzzCInitRequest: whatever a request holds, the init answers it (an
// error, or a start and an exit) and goes on serving.
func FuzzCInitRequest(f *testing.F) {
	for _, s := range []string{`{"args":["true"]}`, `{"args":["\u00e9\ud83d"],"env":null,"cwd":"/"}`, `{"a":[{"b":{}}],"args":[]}`, `{`, `"\\`, `{"args":["a"],"args":null}`} {
		f.Add([]byte(s))
	}
	p := startInit(f, true) // the requests it makes up run nothing
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) == 0 {
			return // an empty record reads as a closed connection
		}
		c, _ := p.send(t, raw, 3)
		r, fds := readReply(t, c)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if r.Error == "" {
			require.Positive(t, r.Pid, "%q", raw)
			r, _ = readReply(t, c)
			require.NotNil(t, r.Exit, "%q", raw)
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("the init exited on %q: %v", raw, err)
		default:
		}
	})
}

// Every answer arrives: many requests in a row, each on a connection of
// its own as the daemon makes them, each answered before the init closes
// its end. (An init that closed right after its last reply lost one in a
// few thousand: the daemon read EOF.)
func TestCInitEveryAnswerArrives(t *testing.T) {
	p := startInit(t, true) // nothing it is asked to run exists
	for i := 0; i < 20000; i++ {
		c, out := p.send(t, request([]string{"x" + strconv.Itoa(i)}, nil, ""), 3)
		out.Close()
		r, fds := readReply(t, c)
		require.Empty(t, fds)
		require.Contains(t, r.Error, "x"+strconv.Itoa(i)+": executable file not found", "request %d", i)
		c.Close()
	}
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/fd")
	require.NoError(t, err)
	require.Less(t, len(ents), 16, "the init holds no descriptor per request it answered")
}

// TestCInitEndsAProcessWhoseStartNobodyHears: a daemon that gave up on a
// start before its reply (it hung up; here it shut its reading side, so
// the reply fails as a hang-up would make it fail) would leave the started
// process running with nobody to watch or end it: the init ends it.
func TestCInitEndsAProcessWhoseStartNobodyHears(t *testing.T) {
	p := startInit(t, false)
	testenv.RequireUnheardStartEnds(t, p.sock, request([]string{"sleep", "1000"}, nil, "/"))
}
