package sigdefault

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The test binary re-executed under a shell that ignores SIGHUP and SIGINT,
// as nohup or a shell's background job without job control would: it
// reports the signals ignored in a child it starts, with and without
// ForChildren.
func TestMain(m *testing.M) {
	switch os.Getenv("SIGDEFAULT_CHILD") {
	case "":
		os.Exit(m.Run())
	case "fix":
		ForChildren()
		syscall.Kill(os.Getpid(), syscall.SIGINT) // still without effect on the program
		syscall.Kill(os.Getpid(), syscall.SIGHUP)
	}
	out, err := exec.Command("grep", "^SigIgn", "/proc/self/status").Output()
	if err != nil {
		os.Exit(3)
	}
	os.Stdout.Write(out)
	os.Exit(0)
}

func childIgnores(t *testing.T, mode string) (hup, intr bool) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `trap "" HUP INT; exec "$0" -test.run=none`, os.Args[0])
	cmd.Env = append(os.Environ(), "SIGDEFAULT_CHILD="+mode)
	out, err := cmd.Output()
	require.NoError(t, err)
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "SigIgn:")
	require.True(t, ok, "%q", out)
	m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
	require.NoError(t, err)
	return m&(1<<(syscall.SIGHUP-1)) != 0, m&(1<<(syscall.SIGINT-1)) != 0
}

func TestForChildren(t *testing.T) {
	hup, intr := childIgnores(t, "plain")
	require.True(t, hup && intr, "without ForChildren the child inherits SIG_IGN (the setup works)")
	hup, intr = childIgnores(t, "fix")
	require.False(t, hup, "SIGHUP at its default in the child")
	require.False(t, intr, "SIGINT at its default in the child")
}
