package worker

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const lockChildEnv = "EOS_TEST_STATE_LOCK_CHILD"

// Two embedded servers on one state dir would share one SQLite database:
// the second refuses to start and names the first's process; once the
// first stops, the dir is free again.
func TestEmbeddedTemporalOwnsItsStateDir(t *testing.T) {
	dir := t.TempDir()
	start := func() (*DevServer, error) {
		return StartDevServer(context.Background(), DevServerOptions{StateDir: dir, Address: "127.0.0.1:0", UIAddress: "off",
			Secret: []byte(randHex(32)), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}
	first, err := start()
	require.NoError(t, err)
	_, err = start()
	require.ErrorContains(t, err, "state dir "+dir+" is in use by process "+strconv.Itoa(os.Getpid()))
	require.ErrorContains(t, err, "--state-dir")
	first.Stop()
	again, err := start()
	require.NoError(t, err)
	again.Stop()
}

// The lock is the kernel's: a process that dies holding it (kill -9)
// leaves the dir free, with nothing to clean up.
func TestStateDirLockGoesWithItsProcess(t *testing.T) {
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestStateLockChild$", "-test.count=1")
	child.Env = append(os.Environ(), lockChildEnv+"="+dir)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "locked" {
	}
	_, err = lockStateDir(dir)
	require.ErrorContains(t, err, "in use by process "+strconv.Itoa(child.Process.Pid))

	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	unlock, err := lockStateDir(dir)
	require.NoError(t, err)
	unlock()
}

// TestStateLockChild holds dir's lock for TestStateDirLockGoesWithItsProcess.
func TestStateLockChild(t *testing.T) {
	dir := os.Getenv(lockChildEnv)
	if dir == "" {
		return // run only as that test's child
	}
	_, err := lockStateDir(dir)
	require.NoError(t, err)
	os.Stdout.WriteString("locked\n")
	time.Sleep(time.Minute)
}
