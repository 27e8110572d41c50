package activities

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestImportWorkspaceOnDocker: the create path of new sandboxes against
// the real engine and daemon. The container runs the daemon from the
// read-only daemon volume; the workspace is streamed to it once and
// imported as the base (symlinks as links, an empty directory, exec bits,
// a 6 MiB file, a FIFO skipped); a repeat answers the same base; after
// docker restart the daemon is back from the same volume.
func TestImportWorkspaceOnDocker(t *testing.T) {
	acts, _, spec := newDockerActivities(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := spec.SandboxID

	ws := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "src", "empty"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "a.txt"), []byte("alpha\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "src", "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755))
	require.NoError(t, os.Symlink("src/run.sh", filepath.Join(ws, "run-link")))
	require.NoError(t, os.Symlink("/etc/hostname", filepath.Join(ws, "abs-link")))
	big := make([]byte, 6<<20+7)
	_, _ = rand.Read(big)
	require.NoError(t, os.WriteFile(filepath.Join(ws, "src", "big.bin"), big, 0o600))
	require.NoError(t, syscall.Mkfifo(filepath.Join(ws, "pipe"), 0o644))
	sum := sha256.Sum256(big)
	spec.WorkspaceRoot = ws

	// The tree is packed while the container is made (past a buffer
	// smaller than big.bin, so the rest streams), and the first import
	// takes it; the repeat reads the tree itself.
	defer func(m int) { prefetchMax = m }(prefetchMax)
	prefetchMax = 1 << 20
	cspec := spec
	cspec.PrefetchWorkspace = true
	info, err := acts.CreateContainer(ctx, cspec)
	require.NoError(t, err)
	acts.pf.mu.Lock()
	require.Len(t, acts.pf.m, 1, "a prefetch")
	acts.pf.mu.Unlock()
	started, err := acts.StartContainer(ctx, id)
	require.NoError(t, err)
	readyCtx, readyCancel := context.WithTimeout(ctx, time.Minute)
	defer readyCancel()
	require.NoError(t, acts.WaitReady(readyCtx, id, started.Daemon))

	// The daemon's directory is the daemon volume, read-only.
	out, err := exec.Command("docker", "exec", info.Name, "sh", "-c", "touch /usr/local/lib/eos/x 2>&1; cat /proc/mounts | grep ' /usr/local/lib/eos '").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "Read-only file system")
	require.Contains(t, string(out), " ro,")

	res, err := acts.ImportWorkspace(ctx, workflows.ImportWorkspaceInput{Spec: spec, RequestID: "acttest/import_base"})
	require.NoError(t, err)
	require.Equal(t, workflows.CopyReport{Files: 3, Dirs: 3, Symlinks: 2, Bytes: 6 + 19 + int64(len(big)), Skipped: 1, SkippedPaths: []string{"pipe"}}, res.Copy)
	require.NotEmpty(t, res.Base.BaseID)
	require.False(t, res.Base.AlreadyInitialized)
	acts.pf.mu.Lock()
	require.Empty(t, acts.pf.m, "the import took it")
	acts.pf.mu.Unlock()
	again, err := acts.ImportWorkspace(ctx, workflows.ImportWorkspaceInput{Spec: spec, RequestID: "acttest/import_base"})
	require.NoError(t, err)
	require.Equal(t, res.Base.BaseID, again.Base.BaseID)
	require.True(t, again.Base.AlreadyInitialized)

	call := func(ep workflows.DaemonCall) map[string]any {
		t.Helper()
		raw, err := acts.CallDaemon(ctx, ep)
		require.NoError(t, err, "%s", ep.Op)
		var m map[string]any
		require.NoError(t, json.Unmarshal(raw, &m))
		return m
	}
	args := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	sess := call(workflows.DaemonCall{SandboxID: id, Daemon: started.Daemon, Op: "create_workspace_session", Args: args(map[string]any{})})["workspace_session_id"].(string)
	check := "test \"$(readlink run-link)\" = src/run.sh && test \"$(readlink abs-link)\" = /etc/hostname && test -x src/run.sh && " +
		"test ! -x a.txt && test -d src/empty && test ! -e pipe && sha256sum src/big.bin && stat -c %a src/big.bin"
	o := call(workflows.DaemonCall{SandboxID: id, Daemon: started.Daemon, Op: "exec_command",
		Args: args(map[string]any{"workspace_session_id": sess, "yield_time_ms": 60000, "cmd": check})})
	require.EqualValues(t, 0, o["exit_code"], "%v", o)
	require.Contains(t, o["output"], hex.EncodeToString(sum[:]))
	require.Contains(t, o["output"], "600")

	// docker restart: the daemon comes back from the same volume.
	out, err = exec.Command("docker", "restart", "-t", "2", info.Name).CombinedOutput()
	require.NoError(t, err, "%s", out)
	ep, err := acts.resolveDaemon(ctx, id)
	require.NoError(t, err)
	require.NoError(t, acts.WaitReady(readyCtx, id, ep))
	o = call(workflows.DaemonCall{SandboxID: id, Daemon: ep, Op: "file_read", Args: args(map[string]any{"path": "a.txt"})})
	require.Equal(t, "alpha", o["content"], "%v", o)
}
