package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPublishSteps drives the steps the workflow layer runs: prepare,
// commit (retried), finalize (retried); a commit that lost to the head is
// aborted; a prepare the head rejects prepares nothing.
func TestPublishSteps(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	a, b := sb.session(nil), sb.session(nil)
	sb.exec(a, "sed -i 's/^line 3$/LINE THREE/' f.txt")
	sb.exec(b, "sed -i 's/^line 3$/line three/' f.txt")

	prep := sb.ok("publish_prepare", map[string]any{"workspace_session_id": a, "txid": "tx-a"})
	require.Equal(t, true, prep["clean"])
	prepB := sb.ok("publish_prepare", map[string]any{"workspace_session_id": b, "txid": "tx-b"})
	require.Equal(t, true, prepB["clean"], "b's dry run is against the head before a's commit")
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

	rej := sb.ok("publish_commit", map[string]any{"txid": "tx-b"})
	require.Equal(t, false, rej["clean"], "a commit that loses to the head answers with the conflicts")
	require.NotEmpty(t, rej["conflicts"])
	sb.ok("publish_abort", map[string]any{"txid": "tx-b"})
	require.Equal(t, "ok", sb.exec(b, "true")["status"], "the session is back after the abort")

	// Rejected at prepare: nothing is prepared and the session stays
	// active; the workflow's abort is a no-op that refuses a late prepare.
	prep = sb.ok("publish_prepare", map[string]any{"workspace_session_id": b, "txid": "tx-b1"})
	require.Equal(t, false, prep["clean"])
	require.NotEmpty(t, prep["conflicts"])
	require.Equal(t, "ok", sb.exec(b, "true")["status"], "a rejected prepare leaves the session active")
	ab := sb.ok("publish_abort", map[string]any{"txid": "tx-b1", "workspace_session_id": b})
	require.Equal(t, true, ab["not_prepared"])
	sb.fail("publish_prepare", map[string]any{"workspace_session_id": b, "txid": "tx-b1"}, "operation_failed")
	sb.fail("publish_commit", map[string]any{"txid": "tx-b1"}, "operation_failed")

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
	// A directory from the base cannot be renamed on the overlay: it is
	// copied by descriptors (symlinks as symlinks), then removed.
	sb.exec(ws, "ln -s main.go src/link.go")
	sb.ok("file_move", map[string]any{"from": "src", "to": "moved", "workspace_session_id": ws})
	require.Equal(t, "package main\n", sb.read(ws, "moved/main.go"))
	out := sb.exec(ws, "readlink moved/link.go; ls src 2>&1")
	require.Contains(t, out["output"], "main.go\n")
	require.Contains(t, out["output"], "No such file")
	sb.ok("file_delete", map[string]any{"path": "moved", "recursive": true, "workspace_session_id": ws})
	sb.fail("file_read", map[string]any{"path": "src/main.go", "workspace_session_id": ws}, "not_found")
	sb.fail("file_read", map[string]any{"path": "moved/main.go", "workspace_session_id": ws}, "not_found")
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
	// Each step waits for what the command prints when it is ready (a
	// fixed yield can end before a loaded machine ran it).
	printed := func(id, what string) {
		t.Helper()
		require.Eventually(t, func() bool {
			return strings.Contains(fmt.Sprint(sb.ok("read_command_lines", map[string]any{"command_session_id": id})["output"]), what)
		}, 30*time.Second, 20*time.Millisecond, "%s never printed %q", id, what)
	}
	out := sb.ok("exec_command", map[string]any{"cmd": "stty size; read x; stty size", "workspace_session_id": ws, "tty": true, "rows": 30, "cols": 100, "yield_time_ms": 500})
	id := out["command_session_id"].(string)
	printed(id, "30 100")
	sb.ok("resize_command", map[string]any{"command_session_id": id, "rows": 50, "cols": 160})
	out = sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "go\r", "yield_time_ms": 5000})
	require.Equal(t, "ok", out["status"], "%v", out)
	all := sb.ok("read_command_lines", map[string]any{"command_session_id": id})
	require.Contains(t, all["output"], "50 160")

	out = sb.ok("exec_command", map[string]any{"cmd": "trap 'echo got-int; exit 3' INT; echo trapping; while true; do sleep 0.1; done", "workspace_session_id": ws, "tty": true, "yield_time_ms": 300})
	id = out["command_session_id"].(string)
	printed(id, "trapping")
	out = sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "\x03", "yield_time_ms": 5000})
	require.Equal(t, float64(3), out["exit_code"], "%v", out)
	all = sb.ok("read_command_lines", map[string]any{"command_session_id": id})
	require.Contains(t, all["output"], "got-int")
}

// TestImplicitPublishOutcomeInEveryTerminalResponse: a bare command whose
// implicit publish is rejected says so in the terminal response of
// whichever call sees it end, write_command_stdin or read_command_lines.
func TestImplicitPublishOutcomeInEveryTerminalResponse(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	for _, seenBy := range []string{"write_command_stdin", "read_command_lines"} {
		t.Run(seenBy, func(t *testing.T) {
			// The bare command's implicit session starts on this head...
			out := sb.ok("exec_command", map[string]any{"cmd": "read x; sed -i 's/^line 5$/mine/' f.txt", "yield_time_ms": 100})
			require.Equal(t, "running", out["status"], "%v", out)
			id := out["command_session_id"].(string)
			// ...and a session publishes over the same line meanwhile.
			ws := sb.session(nil)
			sb.exec(ws, "sed -i 's/^line 5$/theirs/' f.txt")
			sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})

			var end map[string]any
			if seenBy == "write_command_stdin" {
				end = sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "go\n", "yield_time_ms": 60000})
			} else {
				sb.ok("write_command_stdin", map[string]any{"command_session_id": id, "stdin": "go\n", "yield_time_ms": 0})
				require.Eventually(t, func() bool {
					end = sb.ok("read_command_lines", map[string]any{"command_session_id": id})
					return end["status"] != "running"
				}, 30*time.Second, 5*time.Millisecond)
			}
			require.Equal(t, "ok", end["status"], "%v", end)
			require.Equal(t, true, end["publish_rejected"], "%v", end)
			require.Equal(t, "source_conflict", end["publish_reject_class"], "%v", end)
			require.NotEmpty(t, end["publish_conflicts"], "%v", end)
			again := sb.ok("read_command_lines", map[string]any{"command_session_id": id})
			require.Equal(t, true, again["publish_rejected"], "every later response says so too")
			require.Contains(t, sb.read("", "f.txt"), "theirs\n", "the rejected change was discarded")
			sb.exec("", "sed -i 's/^theirs$/line 5/' f.txt") // the base line again, for the next run
		})
	}
}

// TestPublishSettlesAcrossDaemonRestart: a daemon killed with a prepared,
// uncommitted publish comes back with the session active and its work
// intact; one killed with a committed, unfinalized publish comes back with
// it finalized exactly once. recover_workspace_session ends a publish no
// workflow ends.
func TestPublishSettlesAcrossDaemonRestart(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	a, b, r := sb.session(nil), sb.session(nil), sb.session(nil)
	sb.exec(a, "echo unpublished > wip.txt")
	sb.exec(b, "echo committed > done.txt")
	sb.exec(r, "echo stuck > stuck.txt")
	require.Equal(t, true, sb.ok("publish_prepare", map[string]any{"workspace_session_id": a, "txid": "tx-a"})["clean"])
	require.Equal(t, true, sb.ok("publish_prepare", map[string]any{"workspace_session_id": b, "txid": "tx-b"})["clean"])
	sb.ok("publish_commit", map[string]any{"txid": "tx-b"})
	layers := len(sb.ok("layerstack_history", map[string]any{})["publishes"].([]any))

	sb.restartDaemon()

	states := map[string]any{}
	for _, s := range sb.ok("list_workspace_sessions", map[string]any{})["workspace_sessions"].([]any) {
		m := s.(map[string]any)
		states[m["workspace_session_id"].(string)] = m["finalization_state"]
	}
	require.Equal(t, "active", states[a], "the uncommitted publish was aborted: %v", states)
	require.NotContains(t, states, b, "the committed publish was finalized: %v", states)
	require.Equal(t, "unpublished\n", sb.read(a, "wip.txt"))
	require.Equal(t, "ok", sb.exec(a, "cat wip.txt")["status"])
	sb.fail("publish_commit", map[string]any{"txid": "tx-a"}, "operation_failed")
	require.Equal(t, "committed\n", sb.read("", "done.txt"))
	fin := sb.ok("publish_finalize", map[string]any{"txid": "tx-b"})
	require.Equal(t, true, fin["destroyed"])
	require.Len(t, sb.ok("layerstack_history", map[string]any{})["publishes"].([]any), layers, "committed exactly once")

	// r was active at the restart; a prepare nobody ends leaves it
	// publishing, and recover_workspace_session brings it back.
	require.Equal(t, true, sb.ok("publish_prepare", map[string]any{"workspace_session_id": r, "txid": "tx-r"})["clean"])
	sb.fail("exec_command", map[string]any{"cmd": "true", "workspace_session_id": r}, "operation_failed")
	rec := sb.ok("recover_workspace_session", map[string]any{"workspace_session_id": r})
	require.Equal(t, "active", rec["state"], "%v", rec)
	require.Equal(t, []any{"tx-r"}, rec["aborted_txids"])
	require.Equal(t, "stuck\n", sb.read(r, "stuck.txt"))
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": r})
	require.Equal(t, "stuck\n", sb.read("", "stuck.txt"))
}

// TestKeepPublishRecordUnwritable: an exactly-once publish with keep whose
// record cannot be completed after its commit (a full volume, by the error
// failpoint publish-record) answers kept with the session on the new head
// and no record left; a retry of its txid, however late (after more work
// and another publish of the session), answers kept and changes nothing;
// the txid under another session is refused with nothing changed; a
// daemon restart finds the session as it was.
func TestKeepPublishRecordUnwritable(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws, other := sb.sessionWith("echo one > one.txt"), sb.sessionWith("echo mine > mine.txt")
	sb.arm("error:publish-record")
	args := map[string]any{"workspace_session_id": ws, "keep": true, "exactly_once": true, "txid": "tx-k"}
	first := sb.ok("publish_workspace_session", args)
	require.Equal(t, true, first["clean"], "%v", first)
	require.Equal(t, true, first["kept"], "%v", first)
	require.NoError(t, exec.Command("docker", "exec", sb.name, "test", "!", "-e", "/eos/layerstack/.failpoints").Run(), "the failpoint fired")
	require.Empty(t, strings.TrimSpace(docker(t, "exec", sb.name, "ls", "/eos/txns")), "no record of the publish is left")
	require.Equal(t, "one\n", sb.read("", "one.txt"), "committed")
	layers := func() int { return len(sb.ok("layerstack_history", map[string]any{})["publishes"].([]any)) }
	n := layers()
	onHead := func(when string) {
		for _, s := range sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any) {
			if m := s.(map[string]any); m["workspace_session_id"] == ws {
				require.Equal(t, "active", m["finalization_state"], "%s: %v", when, m)
				require.Equal(t, sb.ok("layerstack", nil)["manifest_version"], m["base_manifest_version"], "%s: on the head", when)
				return
			}
		}
		t.Fatalf("%s: session %s is gone", when, ws)
	}
	onHead("after the publish")

	sb.exec(ws, "echo two > two.txt")
	again := sb.ok("publish_workspace_session", args)
	require.Equal(t, true, again["kept"], "%v", again)
	require.Equal(t, first["publish"], again["publish"])
	require.Equal(t, "two\n", sb.read(ws, "two.txt"), "a retry leaves the session's work alone")

	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true, "exactly_once": true, "txid": "tx-2"})
	sb.exec(ws, "echo three > three.txt")
	late := sb.ok("publish_workspace_session", args)
	require.Equal(t, true, late["kept"], "%v", late)
	require.Equal(t, "three\n", sb.read(ws, "three.txt"), "a late retry leaves the session where it went, its work with it")
	onHead("after a late retry")
	sb.fail("publish_workspace_session", map[string]any{"workspace_session_id": other, "keep": true, "exactly_once": true, "txid": "tx-k"}, "invalid_request")
	sb.fail("publish_workspace_session", map[string]any{"workspace_session_id": ws, "exactly_once": true, "txid": "tx-k"}, "invalid_request")
	sb.fail("publish_workspace_session", map[string]any{"workspace_session_id": other, "exactly_once": true, "txid": "tx-k",
		"verify": map[string]any{"cmd": "true", "timeout_ms": 10000}}, "invalid_request")
	sb.fail("publish_prepare", map[string]any{"workspace_session_id": other, "txid": "tx-k"}, "invalid_request")
	require.Equal(t, "ok", sb.exec(other, "true")["status"], "the other session is not held publishing")
	require.Equal(t, "mine\n", sb.read(other, "mine.txt"), "another session's txid changes nothing of it")
	require.Equal(t, n+1, layers(), "tx-2 only")

	sb.restartDaemon()
	onHead("after a daemon restart")
	require.Equal(t, "three\n", sb.read(ws, "three.txt"))
	require.Equal(t, "mine\n", sb.read(other, "mine.txt"))
	require.Equal(t, n+1, layers())
}

// TestPlainPublishKilledAfterCommit: the daemon killed right after a
// publish without a txid committed (failpoint after-tx), before it closed
// the session, comes back with the publish committed and the session
// closed, as the publish would have left it (it came back active over the
// upper dir it had published, and its next publish was answered with that
// old commit: its new work never published, the session closed with it).
// A publish with keep killed at the same point, and its boot killed while
// it moves the session, goes on over a fresh upper dir, and its next
// publish publishes its new work.
func TestPlainPublishKilledAfterCommit(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws, kept := sb.sessionWith("echo one > one.txt"), sb.sessionWith("echo k1 > k1.txt")
	sb.arm("after-tx")
	sb.dies("publish_workspace_session", map[string]any{"workspace_session_id": ws})
	require.Equal(t, "one\n", sb.read("", "one.txt"), "committed")
	for _, s := range sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any) {
		require.NotEqual(t, ws, s.(map[string]any)["workspace_session_id"], "the published session is closed")
	}

	// Killed after the commit, then again while the boot moves the
	// session onto the commit's lease (move-in-place): the next boot
	// finishes the move.
	sb.arm("after-tx", "move-in-place")
	sb.dies("publish_workspace_session", map[string]any{"workspace_session_id": kept, "keep": true})
	require.NoError(t, exec.Command("docker", "exec", sb.name, "test", "!", "-e", "/eos/layerstack/.failpoints").Run(), "both failpoints fired")
	require.Equal(t, "k1\n", sb.read("", "k1.txt"), "committed")
	require.Equal(t, "ok", sb.exec(kept, "echo k2 > k2.txt")["status"])
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": kept, "keep": true})
	require.Equal(t, "k2\n", sb.read("", "k2.txt"), "the kept session's new work is published")
	require.Equal(t, "k1\n", sb.read(kept, "k1.txt"))
}

// TestImplicitPublishCommittedCloseFails: a bare command whose implicit
// publish committed but whose session the real daemon could not close
// (its teardown fails once, then twice) reports the publish as its
// outcome, not publish_failed, and its change is in the head. A session
// left over is listed finalize_failed, and recover_workspace_session
// closes it, or the daemon killed in that state closes it at boot.
func TestImplicitPublishCommittedCloseFails(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	twice := []string{"error:session-teardown", "error:session-teardown"}
	for i, arm := range [][]string{{"error:session-teardown"}, twice, twice} {
		sb.arm(arm...)
		name := fmt.Sprintf("ran-%d.txt", i)
		out := sb.ok("exec_command", map[string]any{"cmd": "echo ran > " + name, "yield_time_ms": 30000})
		require.Equal(t, "ok", out["status"], "%v", out)
		require.NotContains(t, out, "publish_rejected", "the commit stood: %v", out)
		pub, _ := out["publish"].(map[string]any)
		require.NotNil(t, pub, "%v", out)
		require.Equal(t, "ran\n", sb.read("", name))
		var left []map[string]any
		for _, s := range sb.ok("list_workspace_sessions", map[string]any{})["workspace_sessions"].([]any) {
			left = append(left, s.(map[string]any))
		}
		if len(arm) == 1 {
			require.Empty(t, left, "the second close went through")
			require.Equal(t, true, pub["destroyed"], "%v", pub)
			continue
		}
		require.Equal(t, false, pub["destroyed"], "%v", pub)
		require.Len(t, left, 1)
		require.Equal(t, "finalize_failed", left[0]["finalization_state"], "%v", left[0])
		if i == 2 {
			sb.restartDaemon() // killed with the session left over
		} else {
			rec := sb.ok("recover_workspace_session", map[string]any{"workspace_session_id": left[0]["workspace_session_id"]})
			require.Equal(t, true, rec["destroyed"], "%v", rec)
		}
		require.Empty(t, sb.ok("list_workspace_sessions", map[string]any{})["workspace_sessions"])
		require.Equal(t, "ran\n", sb.read("", name))
	}
}

// TestPublishTxIDOfAnEarlierLease: a publish without exactly_once naming
// a txid this same session committed from a lease it has left since (a
// keep publish retried after the session moved on and wrote more) is
// answered as it is, or refused with the other keep, and never finished
// again: before, the replay moved the session onto the commit's lease
// over a fresh upper dir (or closed it), and the work written since was
// gone.
func TestPublishTxIDOfAnEarlierLease(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	ws := sb.session(nil)
	sb.exec(ws, "echo a > a.txt")
	first := sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "txid": "tx-k", "keep": true})
	sb.exec(ws, "echo more > more.txt")
	again := sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "txid": "tx-k", "keep": true})
	require.Equal(t, first["publish"].(map[string]any)["layer_id"], again["publish"].(map[string]any)["layer_id"], "%v", again)
	require.Equal(t, true, again["kept"], "%v", again)
	sb.fail("publish_workspace_session", map[string]any{"workspace_session_id": ws, "txid": "tx-k"}, "invalid_request")
	require.Equal(t, "more\n", sb.read(ws, "more.txt"), "the work written since is kept")
	require.Equal(t, "ok", sb.exec(ws, "test -f more.txt")["status"])
	sb.fail("file_read", map[string]any{"path": "more.txt"}, "not_found")
	pub := sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})
	require.Equal(t, true, pub["destroyed"], "%v", pub)
	require.Equal(t, "more\n", sb.read("", "more.txt"))
}

// TestCloseAfterFailedDestroyEndsTheSession: a published session whose
// runtime could not be destroyed (the failpoint runtime-destroy: its
// container and processes live on) is finalize_failed, and the close that
// recover_workspace_session runs destroys that runtime too: before, the
// failed stop had dropped the session's handle on it, and its processes ran
// on until the daemon's next boot. A daemon restarted instead closes it at
// boot, its runtime with it.
func TestCloseAfterFailedDestroyEndsTheSession(t *testing.T) {
	sb := startSandbox(t, images[0], baseTree())
	for i, profile := range []string{"shared", "isolated", "shared, closed at boot"} {
		boot := strings.HasSuffix(profile, "at boot")
		profile, _, _ := strings.Cut(profile, ",")
		ws := sb.session(map[string]any{"network_profile": profile})
		sleep := fmt.Sprintf("sleep 31%d", i)
		name := fmt.Sprintf("mine-%d.txt", i)
		sb.exec(ws, "echo mine > "+name)
		sb.daemonize(ws, "/workspace", sleep)
		sleeping := func() bool {
			return strings.Contains(docker(t, "exec", sb.name, "ps", "-o", "args"), sleep)
		}
		require.True(t, sleeping(), profile)
		sb.arm("error:runtime-destroy")
		sb.fail("publish_workspace_session", map[string]any{"workspace_session_id": ws}, "operation_failed")
		require.Equal(t, "mine\n", sb.read("", name), "the commit stands")
		require.True(t, sleeping(), "the failed destroy left the %s session's processes running", profile)
		if boot {
			sb.restartDaemon()
		} else {
			rec := sb.ok("recover_workspace_session", map[string]any{"workspace_session_id": ws})
			require.Equal(t, true, rec["destroyed"], "%v", rec)
		}
		require.Eventually(t, func() bool { return !sleeping() }, 10*time.Second, 50*time.Millisecond,
			"the close destroyed the runtime the failed stop left (%s)", profile)
		require.Empty(t, sb.ok("list_workspace_sessions", map[string]any{})["workspace_sessions"])
	}
}

// TestFailedDestroyStaysListed: a destroy that cannot end the session's
// processes (the failpoints runtime-kill and runtime-destroy: its kill
// fails, then the teardown's destroy of the runtime) answers
// operation_failed with the session finalize_failed and leaves it listed,
// not gone with its processes running until the next boot (before, the
// session left the table and a retried destroy answered not_found). A
// retried destroy ends it, a recover finishes its destroy (it is not
// started again), and a daemon restart removes it at boot.
func TestFailedDestroyStaysListed(t *testing.T) {
	// No warm sessions: a warm build holds a lease, which would move the
	// lease count this test reads.
	sb := startSandboxWith(t, images[0], baseTree(), nil, []string{"--warm-sessions", "0"})
	leases := func() float64 {
		return sb.ok("daemon", nil)["daemon"].(map[string]any)["ownership"].(map[string]any)["leases"].(float64)
	}
	for i, then := range []string{"destroy again", "recover", "restart the daemon"} {
		ws := sb.session(nil)
		held := leases()
		sleep := fmt.Sprintf("sleep 32%d", i)
		sb.exec(ws, "echo mine > mine.txt")
		sb.daemonize(ws, "/workspace", sleep)
		sleeping := func() bool {
			return strings.Contains(docker(t, "exec", sb.name, "ps", "-o", "args"), sleep)
		}
		sb.arm("error:runtime-kill", "error:runtime-destroy")
		e := sb.fail("destroy_workspace_session", map[string]any{"workspace_session_id": ws}, "operation_failed")
		det := e["details"].(map[string]any)
		require.Equal(t, "finalize_failed", det["session_state"], "%v", e)
		require.Equal(t, false, det["destroyed"], "%v", e)
		require.True(t, sleeping(), "%s: the failed destroy left the session's processes running", then)
		list := sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any)
		var listed map[string]any
		for _, l := range list {
			if l.(map[string]any)["workspace_session_id"] == ws {
				listed = l.(map[string]any)
			}
		}
		require.NotNil(t, listed, "%s: the session whose destroy failed is still listed: %v", then, list)
		require.Equal(t, "finalize_failed", listed["finalization_state"], "%v", listed)
		require.Equal(t, held, leases(), "%s: the lease stays while the session's processes may run over its layers", then)

		switch then {
		case "destroy again":
			require.Equal(t, true, sb.ok("destroy_workspace_session", map[string]any{"workspace_session_id": ws})["destroyed"])
		case "recover":
			rec := sb.ok("recover_workspace_session", map[string]any{"workspace_session_id": ws})
			require.Equal(t, true, rec["destroyed"], "%v", rec)
		default:
			sb.restartDaemon()
		}
		require.Eventually(t, func() bool { return !sleeping() }, 10*time.Second, 50*time.Millisecond, "%s ends the session's processes", then)
		for _, l := range sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any) {
			require.NotEqual(t, ws, l.(map[string]any)["workspace_session_id"], then)
		}
		sb.fail("file_read", map[string]any{"workspace_session_id": ws, "path": "mine.txt"}, "not_found")
		sb.fail("destroy_workspace_session", map[string]any{"workspace_session_id": ws}, "not_found")
		require.Equal(t, held-1, leases(), "%s: the lease is released", then)
		require.Eventually(t, func() bool {
			return !strings.Contains(docker(t, "exec", sb.name, "ls", "/eos/sessions"), ws)
		}, 10*time.Second, 50*time.Millisecond, "%s removes the session's dir", then)
	}
}
