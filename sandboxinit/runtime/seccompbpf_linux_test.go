//go:build cgo && seccomp

package runtime

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCompiledFilter compiles the sessions' filter once, the way New does,
// and loads it in a child process the way a session init does: what
// sessions must not do fails with EPERM, clone3 and syscalls newer than
// every one the profile names with ENOSYS (runc's stub), the rest works.
func TestCompiledFilter(t *testing.T) {
	kernel, err := kernelVersion()
	require.NoError(t, err)
	f, err := sessionSeccomp(sandboxProfile, goruntime.GOARCH, kernel, sessionCaps)
	require.NoError(t, err)
	sf, err := newSessionFilter(f)
	require.NoError(t, err)
	prog, err := compileFilter(sf.config())
	require.NoError(t, err)
	require.Greater(t, len(prog.Prog), 100)
	mf, err := prog.Memfd()
	require.NoError(t, err)
	defer mf.Close()

	own, err := seccompFilters("self")
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFilterChild$", "-test.v")
	cmd.Env = append(os.Environ(), "EOS_FILTER_CHILD=1", seccompFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{mf}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var res map[string]string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if b, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
			require.NoError(t, json.Unmarshal([]byte(b), &res))
		}
	}
	require.NotNil(t, res, "%s", out)
	require.Equal(t, map[string]string{
		"getpid": "ok", "unshare_user": "operation not permitted", "unshare_ns": "operation not permitted",
		"io_uring": "operation not permitted", "clone3": "function not implemented", "bpf": "operation not permitted",
		"keyctl": "operation not permitted", "future": "function not implemented", "filters": strconv.Itoa(own + 1),
	}, res)
}

// BenchmarkCompileFilter is what runc init paid for every session start
// and libcontainer exec before the filter was compiled once per daemon.
func BenchmarkCompileFilter(b *testing.B) {
	kernel, err := kernelVersion()
	require.NoError(b, err)
	f, err := sessionSeccomp(sandboxProfile, goruntime.GOARCH, kernel, sessionCaps)
	require.NoError(b, err)
	sf, err := newSessionFilter(f)
	require.NoError(b, err)
	for b.Loop() {
		if _, err := compileFilter(sf.config()); err != nil {
			b.Fatal(err)
		}
	}
}
