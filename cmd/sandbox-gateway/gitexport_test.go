package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcplib "github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=User", "GIT_AUTHOR_EMAIL=user@example.com",
		"GIT_COMMITTER_NAME=User", "GIT_COMMITTER_EMAIL=user@example.com", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimRight(string(out), "\n")
}

// repoState is everything of a repository the git hand-off must not touch:
// HEAD, the checked-out branch, the index, the working tree.
func repoState(t *testing.T, dir string) string {
	return strings.Join([]string{gitIn(t, dir, "rev-parse", "HEAD"), gitIn(t, dir, "symbolic-ref", "HEAD"),
		gitIn(t, dir, "status", "--porcelain", "--ignored", "--untracked-files=all"), gitIn(t, dir, "ls-files", "-s")}, "\n--\n")
}

// TestGitHandOff: export_changes --format git against the real stack and a
// real repository: one commit per publish in publish order, authored by
// the session's agent, message naming session and txid, built on HEAD; the
// working tree, index, HEAD and current branch untouched; `git diff HEAD
// BRANCH` is exactly the published changes; a re-export is a no-op; a
// checked-out, invalid or diverged branch and a non-repository are
// refused with nothing moved. Format patch reaches HTTP, JSON lines and MCP.
func TestGitHandOff(t *testing.T) {
	g := startGatewayProcess(t)
	root := t.TempDir()
	gitIn(t, root, "init", "-q", "-b", "main")
	writeFile(t, filepath.Join(root, "a.txt"), "one\ntwo\n")
	writeFile(t, filepath.Join(root, "b.txt"), "bee\n")
	writeFile(t, filepath.Join(root, ".gitignore"), "*.log\n")
	gitIn(t, root, "add", "-A")
	gitIn(t, root, "commit", "-q", "-m", "initial")
	writeFile(t, filepath.Join(root, "local.log"), "untracked, ignored\n")
	writeFile(t, filepath.Join(root, "wip.txt"), "the user's own untracked work\n")
	head := gitIn(t, root, "rev-parse", "HEAD")

	rec := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", root)
	id := rec["id"].(string)
	cleanupSandbox(t, id)
	// The user goes on committing meanwhile: the export still builds on
	// the commit the workspace was copied from.
	writeFile(t, filepath.Join(root, "later.txt"), "user's later commit\n")
	gitIn(t, root, "add", "later.txt")
	gitIn(t, root, "commit", "-q", "-m", "later")
	before := repoState(t, root)
	rtc := func(argv ...string) map[string]any {
		t.Helper()
		return mustCLI(t, g, rt, append([]string{"--sandbox-id", id}, argv...)...)
	}
	alice := rtc("create_workspace_session", "--agent", "alice")["workspace_session_id"].(string)
	rtc("file_write", "--workspace-session-id", alice, "--path", "a.txt", "--content", "one\nTWO\n")
	bin := filepath.Join(t.TempDir(), "logo.bin")
	require.NoError(t, os.WriteFile(bin, []byte{0, 1, 2, 0xff, 0xfe, '\n', 0}, 0o600))
	rtc("file_upload", "--workspace-session-id", alice, "--path", "img/logo.bin", "--from", bin)
	p1 := rtc("publish_workspace_session", "--workspace-session-id", alice, "--message", "alice: shout two")
	bob := rtc("create_workspace_session", "--agent", "bob")["workspace_session_id"].(string)
	rtc("file_delete", "--workspace-session-id", bob, "--path", "b.txt")
	rtc("exec_command", "--workspace-session-id", bob, "mkdir -p dir && printf 'see\\n' > dir/c.txt && chmod +x dir/c.txt && echo x > .git/evil")
	p2 := rtc("publish_workspace_session", "--workspace-session-id", bob)
	rtc("file_write", "--path", "d.txt", "--content", "sessionless\n")

	start := time.Now()
	out := mustCLI(t, g, mgr, "export_changes", "--sandbox-id", id, "--dest", root, "--format", "git", "--branch", "sandbox/work")
	t.Logf("git export of 3 publishes (CLI): %s", time.Since(start)) // a measurement, not an assertion
	require.Equal(t, before, repoState(t, root), "the working tree, index, HEAD or current branch changed")
	require.Equal(t, head, out["parent"])
	require.Equal(t, "workspace_copied_from", out["parent_source"])
	require.Equal(t, true, out["updated"])
	require.Equal(t, []any{".git/evil"}, out["skipped_paths"])
	commits := out["commits"].([]any)
	require.Len(t, commits, 3, "%v", out)
	txOf := func(p map[string]any) string { return p["publish"].(map[string]any)["txid"].(string) }
	c0, c1, c2 := commits[0].(map[string]any), commits[1].(map[string]any), commits[2].(map[string]any)
	require.Equal(t, alice, c0["workspace_session_id"])
	require.Equal(t, txOf(p1), c0["txid"])
	require.Equal(t, bob, c1["workspace_session_id"])
	require.Equal(t, txOf(p2), c1["txid"])
	require.Equal(t, out["tip"], c2["sha"])
	require.Equal(t, c2["sha"], gitIn(t, root, "rev-parse", "sandbox/work"))

	log := gitIn(t, root, "log", "--format=%an|%cn|%s", "sandbox/work")
	require.True(t, strings.HasPrefix(c2["subject"].(string), "Sessionless change "), "%v", c2)
	require.Equal(t, "sessionless write|Ephemeral Sandbox|"+c2["subject"].(string)+"\n"+
		"bob|Ephemeral Sandbox|Publish of workspace session "+bob+"\n"+
		"alice|Ephemeral Sandbox|alice: shout two\n"+
		"User|User|initial", log, "built on the commit the sandbox was created from, not the user's later one")
	body := gitIn(t, root, "log", "-1", "--format=%B", c0["sha"].(string))
	require.Contains(t, body, "Workspace-Session: "+alice)
	require.Contains(t, body, "Publish-Txid: "+txOf(p1))
	require.Equal(t, "A\tb.txt", gitIn(t, root, "diff", "--name-status", c1["sha"].(string), head, "--", "b.txt"))
	require.Equal(t, "M\ta.txt\nD\tb.txt\nA\td.txt\nA\tdir/c.txt\nA\timg/logo.bin",
		sortedLines(gitIn(t, root, "diff", "--name-status", head, "sandbox/work")))
	require.Equal(t, "one\nTWO", gitIn(t, root, "show", "sandbox/work:a.txt"))
	raw, err := exec.Command("git", "-C", root, "show", "sandbox/work:img/logo.bin").Output()
	require.NoError(t, err)
	require.True(t, bytes.Equal([]byte{0, 1, 2, 0xff, 0xfe, '\n', 0}, raw))
	require.Contains(t, gitIn(t, root, "ls-tree", "sandbox/work", "dir/c.txt"), "100755 blob")

	// A re-export is the same commits: nothing moves.
	again := mustCLI(t, g, mgr, "export_changes", "--sandbox-id", id, "--dest", root, "--format", "git", "--branch", "sandbox/work")
	require.Equal(t, false, again["updated"])
	require.Equal(t, out["tip"], again["tip"])

	refs := gitIn(t, root, "for-each-ref")
	refuse := func(kind, msg string, argv ...string) {
		t.Helper()
		r := runCLI(t, g, mgr, append([]string{"export_changes", "--sandbox-id", id}, argv...)...)
		require.NotEqual(t, 0, r.code, "%v: %s", argv, r.stdout)
		require.Equal(t, kind, r.errEnv["kind"], "%v", r.errEnv)
		require.Contains(t, r.errEnv["message"], msg)
		require.Equal(t, refs, gitIn(t, root, "for-each-ref"), "a refused export moved a ref")
		require.Equal(t, before, repoState(t, root))
	}
	refuse("operation_conflict", "checked out", "--dest", root, "--format", "git", "--branch", "main")
	refuse("invalid_request", "not a valid branch name", "--dest", root, "--format", "git", "--branch", "bad..name")
	refuse("invalid_request", "branch", "--dest", root, "--format", "git")
	refuse("invalid_request", "workspace_root", "--dest", t.TempDir(), "--format", "git", "--branch", "x")
	// A sandbox whose workspace_root is not in a git repository.
	notRepo := t.TempDir()
	writeFile(t, filepath.Join(notRepo, "n.txt"), "n\n")
	nid := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", notRepo)["id"].(string)
	cleanupSandbox(t, nid)
	r := runCLI(t, g, mgr, "export_changes", "--sandbox-id", nid, "--dest", notRepo, "--format", "git", "--branch", "x")
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.errEnv["message"], "not inside a git working tree")
	_, err = os.Stat(filepath.Join(notRepo, ".git"))
	require.True(t, os.IsNotExist(err))
	// A branch elsewhere (not an ancestor of the export) is kept unless --force.
	lone := gitIn(t, root, "commit-tree", "-m", "unrelated", gitIn(t, root, "hash-object", "-t", "tree", "/dev/null"))
	gitIn(t, root, "update-ref", "refs/heads/other", lone)
	refs = gitIn(t, root, "for-each-ref")
	refuse("operation_conflict", "not an ancestor", "--dest", root, "--format", "git", "--branch", "other")
	forced := mustCLI(t, g, mgr, "export_changes", "--sandbox-id", id, "--dest", root, "--format", "git", "--branch", "other", "--force")
	require.Equal(t, lone, forced["previous_tip"])
	require.Equal(t, out["tip"], gitIn(t, root, "rev-parse", "other"))
	require.Equal(t, before, repoState(t, root))

	// Format patch from every door (the CLI's is in TestWorkflowsFromTheCLI).
	pdir := t.TempDir()
	st, b, err := g.HTTPOp("export_changes", map[string]any{"args": map[string]any{"sandbox_id": id, "dest": filepath.Join(pdir, "http.patch"), "format": "patch"}})
	require.NoError(t, err)
	require.Equal(t, 200, st, "%s", b)
	line, err := testenv.RawLine(g.Addr, map[string]any{"op": "export_changes", "scope": map[string]any{"kind": "system"},
		"args": map[string]any{"sandbox_id": id, "dest": filepath.Join(pdir, "jl.patch"), "format": "patch"}, "_sandbox_gateway_auth_token": g.Token})
	require.NoError(t, err)
	require.NotContains(t, string(line), `"error"`)
	cl, err := mcpclient.NewStreamableHttpClient("http://"+g.Addr+"/mcp/management",
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + g.Token}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	require.NoError(t, cl.Start(t.Context()))
	init := mcplib.InitializeRequest{}
	init.Params.ClientInfo = mcplib.Implementation{Name: "git", Version: "1"}
	init.Params.ProtocolVersion = mcplib.ProtocolVersion20250618
	_, err = cl.Initialize(t.Context(), init)
	require.NoError(t, err)
	req := mcplib.CallToolRequest{}
	req.Params.Name = "export_changes"
	req.Params.Arguments = map[string]any{"sandbox_id": id, "dest": filepath.Join(pdir, "mcp.patch"), "format": "patch"}
	res, err := cl.CallTool(t.Context(), req)
	require.NoError(t, err)
	sc, _ := json.Marshal(res.StructuredContent)
	require.False(t, res.IsError, "%s", sc)
	for _, f := range []string{"http.patch", "jl.patch", "mcp.patch"} {
		p, err := os.ReadFile(filepath.Join(pdir, f))
		require.NoError(t, err)
		require.Contains(t, string(p), "diff --git a/a.txt b/a.txt", f)
		require.Contains(t, string(p), "+TWO", f)
	}

	// After a squash the publishes are one layer: one commit, the same
	// tree, naming every squashed publish; the old branch is no longer an
	// ancestor of that history.
	mustCLI(t, g, mgr, "squash_layerstacks", "--sandbox-id", id)
	sq := mustCLI(t, g, mgr, "export_changes", "--sandbox-id", id, "--dest", root, "--format", "git", "--branch", "sandbox/squashed")
	require.Len(t, sq["commits"], 1, "%v", sq)
	require.Equal(t, gitIn(t, root, "rev-parse", "sandbox/work^{tree}"), gitIn(t, root, "rev-parse", "sandbox/squashed^{tree}"))
	msg := gitIn(t, root, "log", "-1", "--format=%B", "sandbox/squashed")
	for _, tx := range []string{txOf(p1), txOf(p2), c2["txid"].(string)} {
		require.Contains(t, msg, "Squashed-Publish-Txid: "+tx)
	}
	refs = gitIn(t, root, "for-each-ref")
	refuse("operation_conflict", "not an ancestor", "--dest", root, "--format", "git", "--branch", "sandbox/work")
	require.Equal(t, before, repoState(t, root))
}

func sortedLines(s string) string {
	ls := strings.Split(s, "\n")
	path := func(l string) string { _, p, _ := strings.Cut(l, "\t"); return p }
	sort.Slice(ls, func(i, j int) bool { return path(ls[i]) < path(ls[j]) })
	return strings.Join(ls, "\n")
}
