package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime/sessinit"
	"golang.org/x/sys/unix"
)

// startExecServer serves the fast exec protocol from this test process, as
// the session init would, and reaps its children.
func startExecServer(t *testing.T, dir string) *Session {
	t.Helper()
	f, err := listenExecSocket(execSocketPath(dir))
	require.NoError(t, err)
	ln, err := net.FileListener(f)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	srv := sessinit.NewServer()
	go srv.Serve(ln.(*net.UnixListener))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			srv.Reap()
			time.Sleep(time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
	})
	return &Session{spec: SessionSpec{ID: "t"}, fastSock: execSocketPath(dir)}
}

func TestExecViaInit(t *testing.T) {
	s := startExecServer(t, t.TempDir())
	ctx := context.Background()
	env := mergeEnv(defaultEnv, []string{"GREETING=hi"})

	tests := []struct {
		name     string
		args     []string
		stdin    string
		wantOut  string
		wantErr  string
		wantCode int
	}{
		{name: "stdout and env", args: []string{"sh", "-c", "echo $GREETING; pwd"}, wantOut: "hi\n/\n"},
		{name: "exit code", args: []string{"sh", "-c", "exit 7"}, wantCode: 7},
		{name: "stderr", args: []string{"sh", "-c", "echo oops >&2"}, wantErr: "oops\n"},
		{name: "stdin", args: []string{"cat"}, stdin: "in\n", wantOut: "in\n"},
		{name: "killed by signal", args: []string{"sh", "-c", "kill -KILL $$"}, wantCode: -9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			ps := ProcSpec{Args: tt.args, Cwd: "/", Stdout: &out, Stderr: &errOut}
			if tt.stdin != "" {
				ps.Stdin = strings.NewReader(tt.stdin)
			}
			p, err := s.execViaInit(ctx, ps, env)
			require.NoError(t, err)
			// 0 when the process was already reaped inside the session.
			require.GreaterOrEqual(t, p.Pid(), 0)
			code, err := p.Wait()
			require.NoError(t, err)
			require.Equal(t, tt.wantCode, code)
			require.Equal(t, tt.wantOut, out.String())
			require.Equal(t, tt.wantErr, errOut.String())
		})
	}
}

func TestExecViaInitSignalsAndErrors(t *testing.T) {
	s := startExecServer(t, t.TempDir())
	ctx := context.Background()

	// Signal reaches the group: the shell's child sleep dies with it.
	p, err := s.execViaInit(ctx, ProcSpec{Args: []string{"sh", "-c", "sleep 30; true"}, Cwd: "/"}, defaultEnv)
	require.NoError(t, err)
	require.NoError(t, p.Signal(unix.SIGTERM))
	code, err := p.Wait()
	require.NoError(t, err)
	require.Equal(t, -int(unix.SIGTERM), code)
	require.ErrorIs(t, p.Signal(unix.SIGTERM), os.ErrProcessDone)

	// A done context kills it.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	p, err = s.execViaInit(cctx, ProcSpec{Args: []string{"sleep", "30"}, Cwd: "/"}, defaultEnv)
	require.NoError(t, err)
	code, err = p.Wait()
	require.NoError(t, err)
	require.Equal(t, -int(unix.SIGKILL), code)

	// Nil stdin is a pipe the caller writes.
	var out bytes.Buffer
	p, err = s.execViaInit(ctx, ProcSpec{Args: []string{"cat"}, Cwd: "/", Stdout: &out}, defaultEnv)
	require.NoError(t, err)
	_, err = p.Stdin().Write([]byte("piped"))
	require.NoError(t, err)
	require.NoError(t, p.Stdin().Close())
	_, err = p.Wait()
	require.NoError(t, err)
	require.Equal(t, "piped", out.String())

	_, err = s.execViaInit(ctx, ProcSpec{Args: []string{"no-such-command-xyz"}, Cwd: "/"}, defaultEnv)
	require.ErrorContains(t, err, "not found")
	_, err = s.execViaInit(ctx, ProcSpec{Args: []string{"true"}, Cwd: "/no/such/dir"}, defaultEnv)
	require.ErrorContains(t, err, "no such file")

	gone := &Session{spec: SessionSpec{ID: "g"}, fastSock: execSocketPath(t.TempDir())}
	_, err = gone.execViaInit(ctx, ProcSpec{Args: []string{"true"}, Cwd: "/"}, defaultEnv)
	require.ErrorContains(t, err, "dial session init")
}

func TestShortPath(t *testing.T) {
	long := "/tmp/" + strings.Repeat("d", 120) + "/exec.sock"
	require.NoError(t, shortPath("/tmp/x/exec.sock", func(p string) error {
		require.Equal(t, "/tmp/x/exec.sock", p)
		return nil
	}))
	require.NoError(t, os.MkdirAll(long[:len(long)-len("/exec.sock")], 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(long[:len(long)-len("/exec.sock")]) })
	require.NoError(t, shortPath(long, func(p string) error {
		require.Less(t, len(p), 100)
		require.True(t, strings.HasPrefix(p, "/proc/self/fd/"))
		return nil
	}))
}

// pidfdPid answers the pid in our namespace while the process lives, and
// a pid below 1 once it is reaped, through the ioctl and through fdinfo
// alike.
func TestPidfdPid(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	for _, get := range []func(int) (int, error){pidfdPid, pidfdPidFdinfo} {
		pid, err := get(fd)
		require.NoError(t, err)
		require.Equal(t, cmd.Process.Pid, pid)
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	for _, get := range []func(int) (int, error){pidfdPid, pidfdPidFdinfo} {
		pid, err := get(fd)
		require.NoError(t, err)
		require.Less(t, pid, 1, "reaped")
	}
}

// TestExecServerEndsAProcessWhoseStartNobodyHears: the Go session init
// (sessinit.Server, run where the C one is missing) ends a process whose
// start reply could not be sent, as the C init does
// (TestCInitEndsAProcessWhoseStartNobodyHears).
func TestExecServerEndsAProcessWhoseStartNobodyHears(t *testing.T) {
	s := startExecServer(t, t.TempDir())
	req, _ := json.Marshal(sessinit.Request{Args: []string{"sleep", "1000"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"})
	testenv.RequireUnheardStartEnds(t, s.fastSock, req)
}
