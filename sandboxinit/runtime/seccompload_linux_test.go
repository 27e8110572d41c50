package runtime

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime/sessinit"
	"golang.org/x/sys/unix"
)

func TestCompiledFilterEncoding(t *testing.T) {
	f := &compiledFilter{Flags: unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW, Prog: []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 2, K: 0xc000003e},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}}
	b := f.Encode()
	got, err := sessinit.DecodeFilter(b)
	require.NoError(t, err)
	require.Equal(t, f, got)
	for name, bad := range map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("EOSBPF2\n"), b[8:]...),
		"truncated": b[:len(b)-3],
		"longer":    append(append([]byte(nil), b...), 0, 0, 0, 0, 0, 0, 0, 0),
		"no insns":  b[:16],
	} {
		_, err := sessinit.DecodeFilter(bad)
		require.Error(t, err, name)
	}

	mf, err := f.Memfd()
	require.NoError(t, err)
	defer mf.Close()
	_, err = mf.WriteAt([]byte("x"), 0)
	require.Error(t, err, "the memfd is sealed against writes")
	require.Error(t, mf.Truncate(1), "and against shrinking")
}

// startReporter starts a child that writes msg to fd 3 and then sleeps; it
// runs under the test's own seccomp filters only.
func startReporter(t *testing.T, msg string) (*os.File, int) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command("/bin/sh", "-c", `printf "$1" >&3; exec sleep 30`, "sh", msg)
	cmd.ExtraFiles = []*os.File{w}
	require.NoError(t, cmd.Start())
	w.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); r.Close() })
	return r, cmd.Process.Pid
}

// A session init that says "ok" but runs without a filter of its own (an
// InitPath that does not load it, a swapped binary) is refused.
func TestAwaitFilteredRefusesUnfilteredInit(t *testing.T) {
	s := &Session{spec: SessionSpec{ID: "t"}}
	r, pid := startReporter(t, `ok\n`)
	err := s.awaitFiltered(context.Background(), r, pid)
	require.ErrorContains(t, err, "its own is missing")

	r, pid = startReporter(t, `error: load seccomp filter: operation not permitted\n`)
	err = s.awaitFiltered(context.Background(), r, pid)
	require.ErrorContains(t, err, "did not load its seccomp filter: error: load seccomp filter")

	// An init that exits (closes the pipe) without a word.
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	pw.Close()
	err = s.awaitFiltered(context.Background(), pr, os.Getpid())
	require.ErrorContains(t, err, "did not load its seccomp filter")
}

// TestFilterChild is the child of TestCompiledFilter: it loads the filter
// handed as fd 3 the way a session init does and reports the errno of each
// probe.
func TestFilterChild(t *testing.T) {
	if os.Getenv("EOS_FILTER_CHILD") == "" {
		t.Skip("the child of TestCompiledFilter")
	}
	require.NoError(t, unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
	present, err := sessinit.LoadHandedFilter()
	require.True(t, present)
	require.NoError(t, err)
	errno := func(_, _ uintptr, e unix.Errno) string {
		if e == 0 {
			return "ok"
		}
		return e.Error()
	}
	res := map[string]string{
		"getpid":       errno(unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)),
		"unshare_user": errno(unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)),
		"unshare_ns":   errno(unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWNS, 0, 0)),
		"io_uring":     errno(unix.RawSyscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)),
		"clone3":       errno(unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)),
		"bpf":          errno(unix.RawSyscall(unix.SYS_BPF, 0, 0, 0)),
		"keyctl":       errno(unix.RawSyscall(unix.SYS_KEYCTL, 0, 0, 0)),
		"future":       errno(unix.RawSyscall(1000, 0, 0, 0)), // newer than every syscall the profile names
	}
	n, err := seccompFilters("self")
	require.NoError(t, err)
	res["filters"] = strconv.Itoa(n)
	b, _ := json.Marshal(res)
	_, _ = os.Stdout.Write(append([]byte("RESULT "), b...))
	_, _ = os.Stdout.Write([]byte("\n"))
}
