package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// TestWarmSession: the daemon keeps pre-started sessions (four by default)
// that a plain create adopts. Before it is adopted it is in no list and
// holds no lease; adopted, it is an ordinary session on the head of its
// create: a create right after a publish adopts one built on the head
// before and moves it onto the new head (rehead), which its own processes
// see at /workspace; once the head is still the builder moves the others;
// a fork, an isolated session or one with limits never adopts it; a
// restart removes a warm session the daemon left behind.
func TestWarmSession(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	warm, head, readyAt := warmViews(t, sb)
	pool := warm()["pool"]
	require.EqualValues(t, 4, pool, "the default pool (sandboxinit.DefaultWarmSessions)")
	readyAt(head())
	require.Empty(t, sb.ok("list_workspace_sessions", nil)["workspace_sessions"], "the warm session is in no list")
	// Its build ran on a niced thread of the daemon (--warm-nice 10); its
	// init was forked at the daemon's weight: no process in the sandbox is
	// left niced (the daemon's niced threads end with their builds).
	nices := strings.Fields(docker(t, "exec", sb.name, "sh", "-c", "cat /proc/[0-9]*/stat | awk '{print $19}'"))
	for _, n := range nices {
		require.Equal(t, "0", n, "nice values in the sandbox: %v", nices)
	}
	require.EqualValues(t, 0, sb.ok("daemon", nil)["daemon"].(map[string]any)["ownership"].(map[string]any)["leases"], "it holds no lease")

	// A plain create adopts it: an ordinary session from then on.
	ws := sb.session(map[string]any{"agent": "a1"})
	require.EqualValues(t, 1, warm()["adopted"], "%v", warm())
	list := sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any)
	require.Len(t, list, 1)
	require.Equal(t, "a1", list[0].(map[string]any)["agent"])
	require.Equal(t, "base\n", sb.read(ws, "f.txt"))
	// Adopted, its init and its commands run at the daemon's weight.
	out := sb.exec(ws, "awk '{print $19}' /proc/self/stat; awk '{print $19}' /proc/1/stat")
	require.Equal(t, []string{"0", "0"}, strings.Fields(out["output"].(string)), "nice of a command and of the session's init: %v", out)
	require.Equal(t, "ok", sb.exec(ws, "echo one > f.txt")["status"])
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})

	// The head moved: a create at once adopts a warm session built on the
	// head before, moved onto the new head first. Its processes see that
	// head, and what they write is theirs alone.
	ws2 := sb.session(nil)
	w := warm()
	require.EqualValues(t, 2, w["adopted"], "%v", w)
	require.GreaterOrEqual(t, w["reheaded"], float64(1), "%v", w)
	require.Equal(t, "one\n", sb.read(ws2, "f.txt"), "an adopted session starts on the head of its create")
	require.Equal(t, "one", sb.exec(ws2, "cat /workspace/f.txt")["output"], "the session's own /workspace is the new head")
	require.Equal(t, "ok", sb.exec(ws2, "echo two > f.txt && echo new > n.txt")["status"])
	require.Equal(t, "two\n", sb.read(ws2, "f.txt"), "the daemon reads what the session wrote")
	// The builder moves the other one once the head is still; a session
	// that adopts it sees the head too, not ws2's work.
	readyAt(head())
	ws3 := sb.session(nil)
	require.Equal(t, "one\nabsent", sb.exec(ws3, "cat /workspace/f.txt; test ! -e /workspace/n.txt && echo absent")["output"])
	sb.ok("destroy_workspace_session", map[string]any{"workspace_session_id": ws3})

	// Creates that ask for more than a plain session never adopt it.
	readyAt(head())
	for _, args := range []map[string]any{{"network_profile": "isolated"}, {"limits": map[string]any{"pids_max": 64}}, {"from": ws2}} {
		id := sb.session(args)
		require.EqualValues(t, 3, warm()["adopted"], "%v adopted the warm session", args)
		sb.ok("destroy_workspace_session", map[string]any{"workspace_session_id": id, "force": true})
	}

	// A restart removes the warm session it finds; the sessions are intact.
	docker(t, "restart", "-t", "5", sb.name)
	sb.connect()
	readyAt(head())
	list = sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any)
	require.Len(t, list, 1, "%v", list)
	dirs := strings.Fields(docker(t, "exec", sb.name, "ls", "/eos/sessions"))
	require.Len(t, dirs, 1+int(pool.(float64)), "the live session and the warm ones, no leftover (the destroyed sessions are gone): %v", dirs)
	require.EqualValues(t, 1, sb.ok("daemon", nil)["daemon"].(map[string]any)["ownership"].(map[string]any)["leases"], "only the live session's lease")
}

// TestFirstSessionAdoptsWarm: the warm builds start on the base when it is
// imported, before init_base answers, so the sandbox's first session,
// created right after, adopts one (waiting for it if it is still starting)
// instead of starting its own.
func TestFirstSessionAdoptsWarm(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	ws := sb.session(nil)
	w := sb.ok("daemon", nil)["daemon"].(map[string]any)["warm_session"].(map[string]any)
	require.EqualValues(t, 1, w["adopted"], "the first session adopted a warm one: %v", w)
	require.Equal(t, "base\n", sb.read(ws, "f.txt"))
	require.Equal(t, "ok", sb.exec(ws, "test -f /workspace/f.txt")["status"])
}

// warmViews reads the daemon's warm pool (its daemon view), the head's
// manifest version, and waits until the pool is full on version v with no
// build running (a build holds a lease).
func warmViews(t *testing.T, sb *sandbox) (warm func() map[string]any, head func() float64, readyAt func(v float64)) {
	warm = func() map[string]any {
		return sb.ok("daemon", nil)["daemon"].(map[string]any)["warm_session"].(map[string]any)
	}
	head = func() float64 { return sb.ok("layerstack", nil)["manifest_version"].(float64) }
	readyAt = func(v float64) {
		t.Helper()
		require.Eventually(t, func() bool {
			w := warm()
			return w["ready_count"] == w["pool"] && w["building"] == false && w["manifest_version"] == v
		}, time.Minute, 50*time.Millisecond, "warm sessions on manifest version %v: %v", v, warm())
	}
	return warm, head, readyAt
}

// TestWarmBuildKilled: the daemon killed while it builds a warm session
// (failpoint warm-build: the session's record written, the session started,
// the builder's lease held) comes back with nothing of that session left —
// no session in any list, no lease, no dir, no mount, no cgroup — and the
// pool is built again and adopted from.
func TestWarmBuildKilled(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	warm, head, readyAt := warmViews(t, sb)
	readyAt(head())
	sb.arm("warm-build")
	// The create adopts a warm session; the build that replaces it is killed.
	ws := sb.session(nil)
	require.Eventually(t, func() bool {
		return exec.Command("docker", "exec", sb.name, "test", "!", "-e", "/eos/layerstack/.failpoints").Run() == nil
	}, 30*time.Second, 50*time.Millisecond, "the warm-build failpoint never fired")
	sb.connect() // the supervisor restarted the daemon
	readyAt(head())

	onlySessionAndPool(t, sb, ws, int(warm()["pool"].(float64)))
	// The rebuilt pool is adopted from.
	ws2 := sb.session(nil)
	require.EqualValues(t, 1, warm()["adopted"], "%v", warm())
	require.Equal(t, "base\n", sb.read(ws2, "f.txt"))
}

// TestWarmReheadKilled: the daemon killed while a create moves a warm
// session onto the head a publish just made (failpoint warm-rehead: the old
// head's overlay unmounted, the new one not yet mounted, the create's lease
// held) comes back with nothing of that session left (no session in any
// list, no lease, no dir, no mount, no cgroup); the create that died gets
// no session, and the next one, on the rebuilt pool, starts on the head.
func TestWarmReheadKilled(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	warm, head, readyAt := warmViews(t, sb)
	readyAt(head())
	ws := sb.session(nil)
	require.Equal(t, "ok", sb.exec(ws, "echo one > f.txt")["status"])
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true})
	sb.arm("warm-rehead")
	// The create adopts a warm session built on the base and dies moving it.
	sb.dies("create_workspace_session", map[string]any{})
	readyAt(head())

	onlySessionAndPool(t, sb, ws, int(warm()["pool"].(float64)))
	// The next create adopts from the rebuilt pool, on the head.
	ws2 := sb.session(nil)
	require.EqualValues(t, 1, warm()["adopted"], "%v", warm())
	require.Equal(t, "one", sb.exec(ws2, "cat /workspace/f.txt")["output"])
}

// TestKeepMovesIdleSessionInPlace: a publish with keep (and a refresh)
// moves a session whose workspace nothing holds open onto the new head
// without restarting it (its processes outside the workspace live on);
// one with a process in its workspace is restarted onto it, that process
// ended. Either way the session's own /workspace is the new head.
func TestKeepMovesIdleSessionInPlace(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	ws := sb.session(nil)
	// A process outside the workspace: its working directory is /.
	sb.daemonize(ws, "/", "sleep 4101")
	require.Equal(t, "ok", sb.exec(ws, "echo one > f.txt")["status"])
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true})
	require.True(t, sb.running(ws, "sleep 4101"), "an idle session moved in place: its processes live on")
	require.Equal(t, "one", sb.exec(ws, "cat /workspace/f.txt")["output"])
	require.Equal(t, "ok", sb.exec(ws, "echo two > g.txt")["status"], "the moved workspace takes writes")
	require.Equal(t, "two\n", sb.read(ws, "g.txt"))

	// Someone else publishes; a refresh moves the idle session in place too.
	sb.ok("file_write", map[string]any{"path": "other.txt", "content": "other\n"})
	sb.ok("refresh_workspace_session", map[string]any{"workspace_session_id": ws})
	require.True(t, sb.running(ws, "sleep 4101"), "a refresh moved the idle session in place")
	require.Equal(t, "other\ntwo", sb.exec(ws, "cat /workspace/other.txt /workspace/g.txt")["output"])

	// A process with its working directory in the workspace holds it: the
	// session restarts onto the new head, every process of it ended.
	sb.daemonize(ws, "/workspace", "sleep 4102")
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true})
	require.False(t, sb.running(ws, "sleep 4102"), "a busy session restarted")
	require.False(t, sb.running(ws, "sleep 4101"), "a restart ends every process")
	require.Equal(t, "one\nother\ntwo", sb.exec(ws, "cat /workspace/f.txt /workspace/other.txt /workspace/g.txt")["output"])
}

// TestMoveInPlaceKilled: the daemon killed while it moves an idle session
// in place after a publish with keep (failpoint move-in-place: the
// workspace unmounted, the record not yet saved) comes back with the
// publish committed and the session active on the new head, its work
// there, taking writes; nothing else of it is left over.
func TestMoveInPlaceKilled(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	ws := sb.session(nil)
	require.Equal(t, "ok", sb.exec(ws, "echo one > f.txt")["status"])
	sb.arm("move-in-place")
	sb.dies("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true})

	require.Equal(t, "one\n", sb.read("", "f.txt"), "the publish committed")
	list := sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any)
	require.Len(t, list, 1, "%v", list)
	require.Equal(t, ws, list[0].(map[string]any)["workspace_session_id"])
	require.Equal(t, "active", list[0].(map[string]any)["finalization_state"], "%v", list[0])
	require.Equal(t, sb.ok("layerstack", nil)["manifest_version"], list[0].(map[string]any)["base_manifest_version"], "on the new head")
	require.Equal(t, "one", sb.exec(ws, "cat /workspace/f.txt")["output"])
	require.Equal(t, "ok", sb.exec(ws, "echo two > g.txt")["status"])
	require.Equal(t, "two\n", sb.read(ws, "g.txt"))
	uppers := docker(t, "exec", sb.name, "sh", "-c", "ls -d /eos/sessions/"+ws+"/upper-* | wc -l")
	require.LessOrEqual(t, strings.TrimSpace(uppers), "2", "at most the new upper dir and the one the crash left")
	// The published change is the head's now, not the session's: its
	// upper dir holds only what it wrote since (a stale copy would hide
	// others' later changes to f.txt from it and publish again with it).
	var rec struct {
		Upper string `json:"upper"`
	}
	require.NoError(t, json.Unmarshal([]byte(docker(t, "exec", sb.name, "cat", "/eos/sessions/"+ws+"/session.json")), &rec))
	require.Equal(t, "g.txt", strings.TrimSpace(docker(t, "exec", sb.name, "ls", "/eos/sessions/"+ws+"/"+rec.Upper)), "the session's upper dir %s", rec.Upper)
	sb.ok("file_write", map[string]any{"path": "f.txt", "content": "other\n"})
	sb.ok("refresh_workspace_session", map[string]any{"workspace_session_id": ws})
	require.Equal(t, "other", sb.exec(ws, "cat /workspace/f.txt")["output"], "another's later change to the published file reaches the session")
}

// TestRefreshKilled: the daemon killed while it moves an idle session in
// place after a refresh (failpoint move-in-place: the store merged the
// session's changes onto the head in a staged upper dir and released the
// old lease; the record not yet saved) comes back with the refresh done:
// the session has its own change and the others' in the same file, and its
// next publish keeps both (over its old upper dir it showed its stale copy,
// and the publish took the others' change back).
func TestRefreshKilled(t *testing.T) {
	base := "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"
	theirs := strings.Replace(base, "10\n", "theirs\n", 1)
	both := strings.Replace(theirs, "1\n", "mine\n", 1)
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": base})
	ws := sb.session(nil)
	require.Equal(t, "ok", sb.exec(ws, "sed -i 's/^1$/mine/' f.txt")["status"])
	sb.ok("file_write", map[string]any{"path": "f.txt", "content": theirs}) // a one-layer commit on the head
	// Killed again while the boot finishes that move (finish-move: the
	// merge renamed into place, the record not saved): the next boot
	// finishes it from there.
	sb.arm("move-in-place", "finish-move")
	sb.dies("refresh_workspace_session", map[string]any{"workspace_session_id": ws})
	require.NoError(t, exec.Command("docker", "exec", sb.name, "test", "!", "-e", "/eos/layerstack/.failpoints").Run(), "both failpoints fired")

	require.Equal(t, both, sb.read(ws, "f.txt"), "the refresh's merge, not the session's old copy")
	require.Equal(t, "ok", sb.exec(ws, "echo more > g.txt")["status"], "the session takes work")
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})
	require.Equal(t, both, sb.read("", "f.txt"), "the publish keeps the others' change")
	require.Equal(t, "more\n", sb.read("", "g.txt"))
}

// onlySessionAndPool checks that the sandbox holds the live session ws
// and pool warm sessions, and nothing of any other: no session in a list,
// no lease, no session dir, no mount, no cgroup.
func onlySessionAndPool(t *testing.T, sb *sandbox, ws string, pool int) {
	t.Helper()
	list := sb.ok("list_workspace_sessions", nil)["workspace_sessions"].([]any)
	require.Len(t, list, 1, "only the live session: %v", list)
	require.Equal(t, ws, list[0].(map[string]any)["workspace_session_id"])
	require.EqualValues(t, 1, sb.ok("daemon", nil)["daemon"].(map[string]any)["ownership"].(map[string]any)["leases"], "only the live session's lease")
	dirs := strings.Fields(docker(t, "exec", sb.name, "ls", "/eos/sessions"))
	require.Len(t, dirs, 1+pool, "the live session and the pool, nothing else: %v", dirs)
	known := map[string]bool{}
	for _, d := range dirs {
		known[d] = true
	}
	// Every session mount and cgroup is one of those sessions'.
	mounts := docker(t, "exec", sb.name, "sh", "-c", "grep -o '/eos/sessions/ws-[0-9a-f]*' /proc/self/mountinfo | sort -u")
	cgroups := docker(t, "exec", sb.name, "sh", "-c", "find /sys/fs/cgroup -maxdepth 4 -type d -name 'ws-*' | sort -u")
	for _, p := range append(strings.Fields(mounts), strings.Fields(cgroups)...) {
		require.True(t, known[p[strings.LastIndex(p, "/")+1:]], "%s is left of a session that is gone (sessions %v)", p, dirs)
	}
}

// dies sends op, which an armed failpoint makes kill the daemon: no answer
// may come back. It returns once the restarted daemon answers.
func (sb *sandbox) dies(op string, args map[string]any) {
	sb.t.Helper()
	body, err := json.Marshal(args)
	require.NoError(sb.t, err)
	req, err := http.NewRequest(http.MethodPost, sb.baseURL+"/rpc/"+op, bytes.NewReader(body))
	require.NoError(sb.t, err)
	req.Header.Set("Authorization", "Bearer "+sb.token)
	if resp, err := sb.client.Do(req); err == nil {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		sb.t.Fatalf("%s answered (%d %s): its failpoint never fired", op, resp.StatusCode, raw)
	}
	sb.connect() // the supervisor restarted the daemon
}

// TestWarmSessionAfterSquash: a squash replaces the layers a warm session
// was built on (it holds no lease, so they go); a create right after it
// moves the warm session onto the squashed head, and the session sees the
// whole published history there.
func TestWarmSessionAfterSquash(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	warm, head, readyAt := warmViews(t, sb)
	for i := 0; i < 3; i++ {
		sb.ok("file_write", map[string]any{"path": fmt.Sprintf("p%d.txt", i), "content": fmt.Sprintf("%d\n", i)})
	}
	readyAt(head())
	before := sb.ok("layerstack", nil)["layers"].([]any)
	require.Len(t, before, 4, "the base and three publishes")
	sb.ok("squash_layerstack", map[string]any{})
	after := sb.ok("layerstack", nil)["layers"].([]any)
	require.Less(t, len(after), len(before), "the squash folded layers: %v", after)
	ws := sb.session(nil)
	w := warm()
	require.EqualValues(t, 1, w["adopted"], "%v", w)
	require.GreaterOrEqual(t, w["reheaded"], float64(1), "the create moved a warm session: %v", w)
	require.Equal(t, "base\n0\n1\n2", sb.exec(ws, "cat /workspace/f.txt /workspace/p0.txt /workspace/p1.txt /workspace/p2.txt")["output"])
	require.Equal(t, "ok", sb.exec(ws, "echo mine > m.txt")["status"])
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})
	require.Equal(t, "mine\n", sb.read("", "m.txt"))
}

// TestFileOpsDuringMoveInPlace: file reads racing publishes with keep of
// the same idle session always find the workspace: a move in place never
// lets a file operation see the bare anchor between two overlays.
func TestFileOpsDuringMoveInPlace(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	ws := sb.session(nil)
	done := make(chan struct{})
	var reads, failed int
	var firstFailure string
	go func() {
		defer close(done)
		for i := 0; i < 400; i++ {
			status, out := sb.call("file_read", map[string]any{"workspace_session_id": ws, "path": "f.txt", "keep_final_newline": true})
			reads++
			if status != http.StatusOK || out["content"] != "base\n" {
				failed++
				if firstFailure == "" {
					firstFailure = fmt.Sprintf("%d %v", status, out)
				}
			}
		}
	}()
	for i := 0; i < 25; i++ {
		sb.ok("file_write", map[string]any{"workspace_session_id": ws, "path": fmt.Sprintf("k%d.txt", i), "content": "k\n"})
		sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true})
	}
	<-done
	require.Zero(t, failed, "%d of %d reads failed while the session moved; the first: %s", failed, reads, firstFailure)
}

// TestWritesDuringKeepAreKept: file writes racing publishes with keep and
// refreshes of the same session are never lost: each one that answered is
// either in a published layer or in the session's changes afterwards (a
// write that came after the capture waits for the move, and lands on the
// new state). Racing a publish that closes the session, a write is
// published or refused (not_found), never acknowledged and lost.
func TestWritesDuringKeepAreKept(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	ws := sb.session(nil)
	done := make(chan struct{})
	var written []string
	go func() {
		defer close(done)
		for i := 0; i < 300; i++ {
			p := fmt.Sprintf("w/%03d.txt", i)
			if status, _ := sb.call("file_write", map[string]any{"workspace_session_id": ws, "path": p, "content": p + "\n"}); status == http.StatusOK {
				written = append(written, p)
			}
		}
	}()
	for i := 0; i < 15; i++ {
		sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws, "keep": true})
		sb.ok("file_write", map[string]any{"path": fmt.Sprintf("other-%d.txt", i), "content": "x\n"}) // the head moves
		sb.ok("refresh_workspace_session", map[string]any{"workspace_session_id": ws})
	}
	<-done
	require.NotEmpty(t, written)
	var lost []string
	for _, p := range written {
		if status, out := sb.call("file_read", map[string]any{"workspace_session_id": ws, "path": p, "keep_final_newline": true}); status != http.StatusOK || out["content"] != p+"\n" {
			lost = append(lost, p)
		}
	}
	require.Empty(t, lost, "%d of %d acknowledged writes are gone", len(lost), len(written))

	// A publish that closes the session: a racing write is published, or
	// is refused because the session is gone; none is acknowledged and lost.
	done = make(chan struct{})
	written, lost = nil, nil
	var refused int
	acked := make(chan struct{})
	go func() {
		defer close(done)
		var once sync.Once
		defer once.Do(func() { close(acked) })
		// Until the session is seen gone a few times (however long the
		// publish takes to close it on a loaded machine).
		for i := 0; i < 5000 && refused < 3; i++ {
			p := fmt.Sprintf("z/%04d.txt", i)
			status, out := sb.call("file_write", map[string]any{"workspace_session_id": ws, "path": p, "content": p + "\n"})
			switch e, _ := out["error"].(map[string]any); {
			case status == http.StatusOK:
				written = append(written, p)
				once.Do(func() { close(acked) })
			case e["kind"] == "not_found":
				refused++
			default:
				t.Errorf("write %s: %d %v", p, status, out)
			}
		}
	}()
	<-acked // the writes race the publish from here on
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": ws})
	<-done
	require.Positive(t, refused, "the writes after the publish find the session closed")
	for _, p := range written {
		if status, out := sb.call("file_read", map[string]any{"path": p, "keep_final_newline": true}); status != http.StatusOK || out["content"] != p+"\n" {
			lost = append(lost, p)
		}
	}
	require.Empty(t, lost, "%d of %d acknowledged writes are not in the head", len(lost), len(written))
}

// TestSessionSeesNoOtherWorkspace: with the workspace anchors shared in the
// daemon's mount namespace, a session's mount table still holds its own
// workspace and nothing of another session's, also after moves in place
// and reheads, and the session cannot change its workspace's mounts.
func TestSessionSeesNoOtherWorkspace(t *testing.T) {
	sb := startSandbox(t, testenv.Images[0], map[string]string{"f.txt": "base\n"})
	a := sb.session(nil)
	b := sb.session(map[string]any{"network_profile": "isolated"})
	sb.ok("file_write", map[string]any{"workspace_session_id": a, "path": "x.txt", "content": "x\n"})
	sb.ok("publish_workspace_session", map[string]any{"workspace_session_id": a, "keep": true}) // a moves in place
	c := sb.session(nil)                                                                        // adopts and reheads a warm session
	for self, others := range map[string][]string{a: {b, c}, b: {a, c}, c: {a, b}} {
		mounts := sb.exec(self, "cat /proc/self/mountinfo")["output"].(string)
		var ws []string
		for _, l := range strings.Split(mounts, "\n") {
			if strings.Contains(l, " /workspace ") {
				ws = append(ws, l)
			}
		}
		// The anchor and, on it, the one overlay: no stale overlay left
		// under or over it by a move.
		require.Len(t, ws, 2, "%s: the anchor and one overlay at /workspace:\n%s", self, mounts)
		require.Contains(t, ws[0], " - tmpfs eos-anchor ro,", "%s: the anchor first, an empty read-only tmpfs", self)
		require.NotContains(t, mounts, "/var/lib/docker", "%s's mount table names a host path", self)
		require.Contains(t, ws[1], " - overlay ", "%s: the overlay on it", self)
		for _, o := range others {
			require.NotContains(t, mounts, o, "%s's mount table shows %s's workspace", self, o)
		}
		out := sb.exec(self, "umount /workspace 2>&1; mount --make-shared /workspace 2>&1; mount -t tmpfs x /workspace 2>&1; echo done")
		require.Contains(t, out["output"], "done")
		require.Equal(t, "base", sb.exec(self, "cat /workspace/f.txt")["output"], "%s's workspace is unchanged: %v", self, out["output"])
	}
}
