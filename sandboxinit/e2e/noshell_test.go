package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// noShellImage is an image with no shell at all (one file, as a
// distroless image has no /bin/sh), imported once per machine.
func noShellImage(t *testing.T) string {
	t.Helper()
	requireDocker(t)
	const image = "eos-test-noshell:1"
	if exec.Command("docker", "image", "inspect", image).Run() == nil {
		return image
	}
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte("noshell\n"), 0o644))
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	out, err := exec.Command("tar", "-C", dir, "-cf", tarball, "etc").CombinedOutput()
	require.NoError(t, err, "%s", out)
	docker(t, "import", "--change", "LABEL eos.test=e2e", tarball, image)
	return image
}

// In an image without /bin/sh a command cannot start: the answer says so
// (operation_failed, naming the program), not internal_error, with and
// without a session and through the TTY path; file operations still work.
func TestCommandInAnImageWithoutAShell(t *testing.T) {
	sb := startSandbox(t, noShellImage(t), map[string]string{"a.txt": "alpha\n"})
	ws := sb.session(nil)
	for _, args := range []map[string]any{
		{"cmd": "echo hi", "workspace_session_id": ws},
		{"cmd": "echo hi", "workspace_session_id": ws, "tty": true},
		{"cmd": "echo hi"}, // an implicit session
	} {
		e := sb.fail("exec_command", args, "operation_failed")
		require.Contains(t, e["message"], "has no /bin/sh", "%v", args)
		require.True(t, strings.HasPrefix(e["message"].(string), "workspace session "), "%v", e)
		require.Equal(t, "/bin/sh", e["details"].(map[string]any)["program"])
	}
	require.Equal(t, "alpha\n", sb.read(ws, "a.txt"))
	// The implicit session the third made is gone with its command.
	sessions := sb.ok("list_workspace_sessions", map[string]any{})["workspace_sessions"].([]any)
	require.Len(t, sessions, 1, "%v", sessions)
	require.Equal(t, ws, sessions[0].(map[string]any)["workspace_session_id"])
}
