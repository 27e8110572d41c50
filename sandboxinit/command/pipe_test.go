package command

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// blocking reads f's O_NONBLOCK (Control leaves the descriptor's mode as is).
func blocking(t *testing.T, f *os.File) bool {
	t.Helper()
	rc, err := f.SyscallConn()
	require.NoError(t, err)
	var flags int
	var ferr error
	require.NoError(t, rc.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }))
	require.NoError(t, ferr)
	return flags&unix.O_NONBLOCK == 0
}

// A command's pipes: the ends the process gets are handed over as blocking
// descriptors out of the poller, the daemon's own ends are non-blocking;
// a TTY command's ends all stay pollable, since the runtime copies between
// them and the pty itself.
func TestCommandPipes(t *testing.T) {
	c, err := newCommand(&Engine{}, "c1", false, Meta{})
	require.NoError(t, err)
	defer c.closePipes()
	require.True(t, blocking(t, c.stdinR), "the process's stdin")
	require.False(t, blocking(t, c.stdin), "the daemon's stdin writer")
	for i := range c.outR {
		require.True(t, blocking(t, c.outW[i]), "the process's output %d", i)
		require.False(t, blocking(t, c.outR[i]), "the daemon's reader %d", i)
	}

	tc, err := newCommand(&Engine{}, "c2", true, Meta{})
	require.NoError(t, err)
	defer tc.closePipes()
	for _, f := range append([]*os.File{tc.stdinR, tc.stdin}, append(tc.outR, tc.outW...)...) {
		require.False(t, blocking(t, f), "a TTY command's pipe end %s", f.Name())
	}
}
