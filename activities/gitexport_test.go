package activities

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

type gitTarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func gitTarOf(t *testing.T, es []gitTarEntry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		if e.mode == 0 {
			e.mode = 0o644
		}
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body))}))
		_, err := tw.Write([]byte(e.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=U", "GIT_AUTHOR_EMAIL=u@x", "GIT_COMMITTER_NAME=U", "GIT_COMMITTER_EMAIL=u@x")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// TestGitExportAppliesLayersAndDistrustsThem: layer streams (from a fake
// daemon) become one commit each on the recorded parent: files, exec bits,
// symlinks, whiteouts and opaque directories; a .git path is skipped; a
// stream with a path escaping the root is refused and no ref moves.
func TestGitExportAppliesLayersAndDistrustsThem(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("the git hand-off needs the git CLI (.ci/run installs it)")
	}
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	for p, c := range map[string]string{"gone.txt": "g\n", "opq/stale": "s\n", "keep.txt": "k\n"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(repo, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(repo, p), []byte(c), 0o644))
	}
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "base")
	parent := git(t, repo, "rev-parse", "HEAD")

	layers := map[string][]byte{
		"L1": gitTarOf(t, []gitTarEntry{{name: "dir/", typ: tar.TypeDir, mode: 0o755}, {name: "dir/run.sh", body: "#!/bin/sh\n", typ: tar.TypeReg, mode: 0o755},
			{name: "link", link: "dir/run.sh", typ: tar.TypeSymlink}, {name: ".wh.gone.txt", typ: tar.TypeReg},
			{name: ".git/", typ: tar.TypeDir}, {name: ".git/hooks/pre-commit", body: "evil", typ: tar.TypeReg}}),
		"L2": gitTarOf(t, []gitTarEntry{{name: "opq/", typ: tar.TypeDir, mode: 0o755}, {name: "opq/.wh..wh..opq", typ: tar.TypeReg},
			{name: "opq/fresh", body: "f\n", typ: tar.TypeReg}}),
	}
	fx := newExportFixture(t)
	d := fx.acts.docker.(*fakeDocker)
	d.files[manifestPath] = func() []byte {
		return []byte(`{"schema_version":1,"version":7,"layers":[{"layer_id":"L2","path":"layers/L2"},{"layer_id":"L1","path":"layers/L1"},{"layer_id":"B1","path":"base"}]}`)
	}
	fd := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
		var args api.ExportArgs
		require.NoError(t, json.Unmarshal(*fx.daemon.body.Load(), &args))
		meta, _ := json.Marshal(api.LayerExportMeta{LayerID: args.LayerID, Kind: "publish", TxID: "tx-" + args.LayerID,
			Owner: "workspace_session:ws-" + args.LayerID, Agent: "Agent <" + args.LayerID + ">", Time: "2026-01-02T03:04:05Z"})
		w.Header().Set("X-Layer-Meta", base64.StdEncoding.EncodeToString(meta))
		w.Header().Set("Trailer", "X-Export-Error")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(layers[args.LayerID])
	})
	fx.daemon, fx.ep = fd, fd.endpoint(t)
	spec := workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: repo, Format: "git", Branch: "eos/x", GitParent: parent}

	// Make HEAD move meanwhile: the export still builds on GitParent.
	require.NoError(t, os.WriteFile(filepath.Join(repo, "later.txt"), []byte("l\n"), 0o644))
	git(t, repo, "add", "later.txt")
	git(t, repo, "commit", "-q", "-m", "later")
	status := git(t, repo, "status", "--porcelain")

	res, err := fx.acts.ExportChanges(context.Background(), spec)
	require.NoError(t, err)
	require.Equal(t, parent, res.Parent)
	require.Equal(t, "workspace_copied_from", res.ParentSource)
	require.Len(t, res.Commits, 2)
	require.Equal(t, "tx-L1", res.Commits[0].TxID)
	require.Equal(t, "ws-L1", res.Commits[0].WorkspaceSessionID)
	require.Equal(t, []string{".git/hooks/pre-commit"}, res.SkippedPaths)
	require.Equal(t, res.Tip, git(t, repo, "rev-parse", "eos/x"))
	require.Equal(t, status, git(t, repo, "status", "--porcelain"))
	require.Equal(t, "Agent  L1|agent-l1@ephemeral-sandbox.invalid|1767323045", git(t, repo, "log", "-1", "--format=%an|%ae|%at", res.Commits[0].SHA))
	tree := git(t, repo, "ls-tree", "-r", "eos/x")
	require.Contains(t, tree, "100755 blob")
	require.Contains(t, tree, "\tdir/run.sh")
	require.Contains(t, tree, "120000 blob")
	require.Contains(t, tree, "\topq/fresh")
	require.Contains(t, tree, "\tkeep.txt")
	for _, gone := range []string{"\tgone.txt", "\topq/stale", ".git", "\tlater.txt"} {
		require.NotContains(t, tree, gone)
	}

	// A hostile stream: nothing is moved.
	layers["L2"] = gitTarOf(t, []gitTarEntry{{name: "../escape", body: "x", typ: tar.TypeReg}})
	spec.Branch = "eos/y"
	_, err = fx.acts.ExportChanges(context.Background(), spec)
	ae, ok := apperr.From(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, api.KindOperationFailed, ae.Kind)
	require.Contains(t, ae.Message, "not a clean relative path")
	require.Equal(t, "", strings.TrimSpace(string(must(exec.Command("git", "-C", repo, "for-each-ref", "refs/heads/eos/y").Output()))))

	// Refused before any stream: a bad branch and a dest other than the
	// workspace root.
	for _, bad := range []workflows.ExportSpec{
		{SandboxID: "sbx1", Daemon: fx.ep, Dest: repo, Format: "git", Branch: "a..b"},
		{SandboxID: "sbx1", Daemon: fx.ep, Dest: repo, Format: "git"},
		{SandboxID: "sbx1", Daemon: fx.ep, Dest: repo, Format: "git", Branch: "ok", WorkspaceRoot: filepath.Join(repo, "elsewhere")},
	} {
		_, err := fx.acts.ExportChanges(context.Background(), bad)
		ae, ok := apperr.From(err)
		require.True(t, ok, "%+v: %v", bad, err)
		require.Equal(t, api.KindInvalidRequest, ae.Kind, "%+v: %v", bad, err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
