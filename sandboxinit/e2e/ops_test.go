package e2e

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPublishSteps drives the steps the workflow layer runs: prepare,
// commit (retried), finalize (retried); a rejected commit is aborted.
func TestPublishSteps(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	a, b := sb.session(nil), sb.session(nil)
	sb.exec(a, "sed -i 's/^line 3$/LINE THREE/' f.txt")
	sb.exec(b, "sed -i 's/^line 3$/line three/' f.txt")

	prep := sb.ok("publish_prepare", map[string]any{"workspace_session_id": a, "txid": "tx-a"})
	require.Equal(t, true, prep["clean"])
	// Commands wait while a publish is prepared.
	sb.fail("exec_command", map[string]any{"cmd": "true", "workspace_session_id": a}, "operation_failed")
	c1 := sb.ok("publish_commit", map[string]any{"txid": "tx-a"})
	c2 := sb.ok("publish_commit", map[string]any{"txid": "tx-a"})
	require.Equal(t, c1["publish"].(map[string]any)["layer_id"], c2["publish"].(map[string]any)["layer_id"], "a retried commit returns the first result")
	require.Equal(t, true, c2["publish"].(map[string]any)["no_op"] == false)
	f1 := sb.ok("publish_finalize", map[string]any{"txid": "tx-a"})
	f2 := sb.ok("publish_finalize", map[string]any{"txid": "tx-a"})
	require.Equal(t, f1, f2, "a retried finalize returns the first answer")
	p2 := sb.ok("publish_prepare", map[string]any{"workspace_session_id": a, "txid": "tx-a"})
	require.Equal(t, true, p2["replayed"], "a retried prepare answers as the first did")
	require.Contains(t, sb.read("", "f.txt"), "LINE THREE\n")

	prep = sb.ok("publish_prepare", map[string]any{"workspace_session_id": b, "txid": "tx-b"})
	require.Equal(t, false, prep["clean"])
	rej := sb.ok("publish_commit", map[string]any{"txid": "tx-b"})
	require.Equal(t, false, rej["clean"], "a commit that loses to the head answers with the conflicts")
	require.NotEmpty(t, rej["conflicts"])
	sb.ok("publish_abort", map[string]any{"txid": "tx-b"})
	require.Equal(t, "ok", sb.exec(b, "true")["status"], "the session is back after the abort")

	// Keep: the session continues on the new head.
	sb.exec(b, "sed -i 's/^line three$/LINE THREE/; s/^line 7$/line seven/' f.txt")
	sb.ok("publish_prepare", map[string]any{"workspace_session_id": b, "txid": "tx-b2", "keep": true})
	sb.ok("publish_commit", map[string]any{"txid": "tx-b2"})
	fin := sb.ok("publish_finalize", map[string]any{"txid": "tx-b2"})
	require.Equal(t, true, fin["kept"])
	require.Contains(t, sb.read(b, "f.txt"), "line seven\n")
	diff := sb.ok("diff_workspace_session", map[string]any{"workspace_session_id": b})
	require.Empty(t, diff["diff"], "nothing unpublished after a kept publish")
}

// TestFileOperations covers list, delete, move, search and blame in a
// session and on the head.
func TestFileOperations(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws := sb.session(nil)
	sb.ok("file_write", map[string]any{"path": "/workspace/docs/a.md", "content": "alpha\nbeta\n", "workspace_session_id": ws})
	list := sb.ok("file_list", map[string]any{"path": "docs", "workspace_session_id": ws})
	require.Equal(t, "a.md", list["entries"].([]any)[0].(map[string]any)["name"])
	sb.ok("file_move", map[string]any{"from": "docs/a.md", "to": "docs/b.md", "workspace_session_id": ws})
	sb.fail("file_read", map[string]any{"path": "docs/a.md", "workspace_session_id": ws}, "not_found")
	found := sb.ok("file_search", map[string]any{"query": "^be", "workspace_session_id": ws})
	require.Equal(t, "docs/b.md", found["matches"].([]any)[0].(map[string]any)["path"])
	glob := sb.ok("file_search", map[string]any{"glob": "*.go", "workspace_session_id": ws})
	require.Equal(t, "src/main.go", glob["matches"].([]any)[0].(map[string]any)["path"])
	sb.ok("file_delete", map[string]any{"path": "src", "recursive": true, "workspace_session_id": ws})
	sb.fail("file_read", map[string]any{"path": "src/main.go", "workspace_session_id": ws}, "not_found")
	require.Equal(t, "package main\n", sb.read("", "src/main.go"), "the head is untouched")

	// Sessionless: each write is one layer owned by its request.
	sb.ok("file_move", map[string]any{"from": "src", "to": "lib"})
	require.Equal(t, "package main\n", sb.read("", "lib/main.go"))
	sb.fail("file_read", map[string]any{"path": "src/main.go"}, "not_found")
	sb.ok("file_delete", map[string]any{"path": "run.sh"})
	sb.ok("file_edit", map[string]any{"path": "f.txt", "edits": []map[string]any{{"old_string": "line 4\n", "new_string": "line four\n"}}})
	blame := sb.ok("file_blame", map[string]any{"path": "f.txt"})
	ranges := blame["ranges"].([]any)
	require.Len(t, ranges, 3)
	require.Equal(t, "original", ranges[0].(map[string]any)["owner"])
	require.True(t, strings.HasPrefix(ranges[1].(map[string]any)["owner"].(string), "operation:"))
	read := sb.ok("file_read", map[string]any{"path": "f.txt", "offset": 4, "limit": 2})
	require.Equal(t, "line four\nline 5", read["content"], "the seed's window: no final newline")
	require.Equal(t, float64(6), read["next_offset"])
	require.Equal(t, float64(10), read["total_lines"])
}

// TestPTYCommands: a command with tty gets a terminal of the asked size,
// resizable, and a literal ^C reaches it as SIGINT.
func TestPTYCommands(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws := sb.session(nil)
	out := sb.ok("exec_command", map[string]any{"cmd": "stty size; read x; stty size", "workspace_session_id": ws, "tty": true, "rows": 30, "cols": 100, "yield_time_ms": 500})
	require.Contains(t, out["output"], "30 100")
	id := out["command_session_id"].(string)
	sb.ok("resize_command", map[string]any{"command_session_id": id, "rows": 50, "cols": 160})
	out = sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "go\r", "yield_time_ms": 5000})
	require.Equal(t, "ok", out["status"], "%v", out)
	all := sb.ok("read_command_lines", map[string]any{"command_session_id": id})
	require.Contains(t, all["output"], "50 160")

	out = sb.ok("exec_command", map[string]any{"cmd": "trap 'echo got-int; exit 3' INT; while true; do sleep 0.1; done", "workspace_session_id": ws, "tty": true, "yield_time_ms": 300})
	id = out["command_session_id"].(string)
	out = sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "\x03", "yield_time_ms": 5000})
	require.Equal(t, float64(3), out["exit_code"], "%v", out)
	all = sb.ok("read_command_lines", map[string]any{"command_session_id": id})
	require.Contains(t, all["output"], "got-int")
}
