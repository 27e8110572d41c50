package main

import (
	"encoding/base64"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// TestSessionFork: create_workspace_session --from against the real stack.
// The fork starts as the forked session is (its base and its unpublished
// changes, binary included), then the two are independent; the forked
// session publishing first makes the fork's copies of its changes merge as
// identical; the fork outlives the forked session's destroy and a squash;
// an unknown, destroyed or malformed --from is refused with nothing
// created; a daemon killed mid-fork leaves no half session and no stray
// lease behind.
func TestSessionFork(t *testing.T) {
	g := startGatewayProcess(t)
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "a.txt"), "one\ntwo\nthree\n")
	writeFile(t, filepath.Join(root, "keep.txt"), "keep\n")
	rec := mustCLI(t, g, mgr, "create_sandbox", "--image", testenv.Images[0], "--workspace-bind-root", root)
	id := rec["id"].(string)
	cleanupSandbox(t, id)
	d := &drill{t: t, g: g, id: id}
	read := func(ws, p string) (string, *api.Error) {
		args := map[string]any{"path": p}
		if ws != "" {
			args["workspace_session_id"] = ws
		}
		m, err := d.op("file_download", args)
		if err != nil {
			return "", err
		}
		b, _ := base64.StdEncoding.DecodeString(m["content_base64"].(string))
		return string(b), nil
	}
	mustRead := func(ws, p string) string {
		t.Helper()
		s, err := read(ws, p)
		require.Nil(t, err, "%s %s: %v", ws, p, err)
		return s
	}
	sessions := func() []string {
		var ids []string
		for _, s := range d.must("list_workspace_sessions", nil)["workspace_sessions"].([]any) {
			ids = append(ids, s.(map[string]any)["workspace_session_id"].(string))
		}
		sort.Strings(ids)
		return ids
	}
	// leaseOwners are the sessions holding a lease, once per lease: every
	// lease pins the base, the last layer.
	leaseOwners := func() []string {
		layers := d.must("layerstack", nil)["layers"].([]any)
		out := []string{}
		for _, o := range layers[len(layers)-1].(map[string]any)["leased_by_workspaces"].([]any) {
			out = append(out, fmt.Sprint(o))
		}
		sort.Strings(out)
		return out
	}
	owners := func(ids []string) []string { return append([]string{}, ids...) }

	x := d.must("create_workspace_session", map[string]any{"agent": "xagent"})["workspace_session_id"].(string)
	d.must("file_write", map[string]any{"workspace_session_id": x, "path": "a.txt", "content": "ONE\ntwo\nthree\n"})
	d.must("file_upload", map[string]any{"workspace_session_id": x, "path": "img.bin", "content_base64": base64.StdEncoding.EncodeToString([]byte{0, 0xff, 1})})
	d.must("file_delete", map[string]any{"workspace_session_id": x, "path": "keep.txt"})

	start := time.Now()
	f := d.must("create_workspace_session", map[string]any{"from": x})
	t.Logf("fork of a session with 3 changes: %s", time.Since(start)) // a measurement, not an assertion
	fid := f["workspace_session_id"].(string)
	require.NotEqual(t, x, fid)
	require.Equal(t, "xagent", f["agent"], "inherited from the forked session")
	require.Equal(t, x, f["forked_from"])
	require.Equal(t, "ONE\ntwo\nthree\n", mustRead(fid, "a.txt"))
	require.Equal(t, "\x00\xff\x01", mustRead(fid, "img.bin"))
	_, err := read(fid, "keep.txt")
	require.NotNil(t, err)
	require.Equal(t, api.KindNotFound, err.Kind)

	// Independent from now on, both ways (files and processes).
	d.must("file_write", map[string]any{"workspace_session_id": x, "path": "x-later.txt", "content": "x\n"})
	d.must("file_write", map[string]any{"workspace_session_id": fid, "path": "f.txt", "content": "f\n"})
	out := d.must("exec_command", map[string]any{"workspace_session_id": fid, "cmd": "test ! -e x-later.txt && echo three >> a.txt && cat a.txt"})
	require.Equal(t, "ONE\ntwo\nthree\nthree", strings.TrimSpace(fmt.Sprint(out["output"])))
	_, err = read(x, "f.txt")
	require.NotNil(t, err)
	require.Equal(t, "ONE\ntwo\nthree\n", mustRead(x, "a.txt"))

	// X publishes first; the fork's copy of X's changes is identical, its
	// own changes land on top.
	d.must("publish_workspace_session", map[string]any{"workspace_session_id": x})
	require.Equal(t, "ONE\ntwo\nthree\n", mustRead(fid, "a.txt")[:len("ONE\ntwo\nthree\n")], "the fork keeps its base")
	pub := d.must("publish_workspace_session", map[string]any{"workspace_session_id": fid})
	require.Equal(t, true, pub["destroyed"], "%v", pub)
	require.Equal(t, "ONE\ntwo\nthree\nthree\n", mustRead("", "a.txt"))
	require.Equal(t, "f\n", mustRead("", "f.txt"))
	require.Equal(t, "x\n", mustRead("", "x-later.txt"))
	require.Equal(t, "\x00\xff\x01", mustRead("", "img.bin"))
	_, err = read("", "keep.txt")
	require.NotNil(t, err)

	// The fork outlives the forked session and a squash.
	y := d.must("create_workspace_session", nil)["workspace_session_id"].(string)
	d.must("file_write", map[string]any{"workspace_session_id": y, "path": "y.txt", "content": "y\n"})
	f2 := d.must("create_workspace_session", map[string]any{"from": y})["workspace_session_id"].(string)
	d.must("destroy_workspace_session", map[string]any{"workspace_session_id": y})
	d.must("squash_layerstacks", nil)
	require.Equal(t, "y\n", mustRead(f2, "y.txt"))
	require.Equal(t, owners([]string{f2}), leaseOwners())

	// A larger delta (1000 files, 32 MiB): a measurement, not an assertion.
	big := d.must("create_workspace_session", nil)["workspace_session_id"].(string)
	r := d.must("exec_command", map[string]any{"workspace_session_id": big, "yield_time_ms": 120000,
		"cmd": "mkdir -p many && for i in $(seq 1 1000); do echo $i > many/$i; done && head -c 33554432 /dev/urandom > blob"})
	require.Equal(t, "ok", r["status"], "%v", r)
	start = time.Now()
	bf := d.must("create_workspace_session", map[string]any{"from": big})["workspace_session_id"].(string)
	t.Logf("fork of a session with 1001 files, 32 MiB: %s", time.Since(start))
	require.Equal(t, "1000\n", mustRead(bf, "many/1000"))
	d.must("destroy_workspace_session", map[string]any{"workspace_session_id": big})
	d.must("destroy_workspace_session", map[string]any{"workspace_session_id": bf})

	// Refusals: nothing is created.
	before := sessions()
	for _, c := range []struct{ from, kind string }{{"ws-nope", api.KindNotFound}, {y, api.KindNotFound}, {x, api.KindNotFound}, {"../ws", api.KindInvalidRequest}} {
		_, err := d.op("create_workspace_session", map[string]any{"from": c.from})
		require.NotNil(t, err, c.from)
		require.Equal(t, c.kind, err.Kind, "%s: %v", c.from, err)
	}
	require.Equal(t, before, sessions())
	require.Equal(t, owners(before), leaseOwners())

	// Killed mid-fork (after the fork's lease is written, before its
	// record): the daemon's supervisor restarts it, the create is retried,
	// and there is exactly one new session, with one lease per session.
	name := workflows.ContainerName(id)
	for _, fp := range []string{"fork-after-upper", "fork-after-lease"} {
		before := sessions()
		out, err := exec.Command("docker", "exec", name, "sh", "-c", "echo "+fp+" > /eos/layerstack/.failpoints").CombinedOutput()
		require.NoError(t, err, "%s", out)
		m, aerr := d.op("create_workspace_session", map[string]any{"from": f2})
		after := sessions()
		require.NoError(t, exec.Command("docker", "exec", name, "test", "!", "-e", "/eos/layerstack/.failpoints").Run(), "%s: the failpoint never fired", fp)
		if aerr == nil {
			require.Len(t, after, len(before)+1, "%s: %v", fp, after)
			require.Contains(t, after, m["workspace_session_id"])
			require.Equal(t, "y\n", mustRead(m["workspace_session_id"].(string), "y.txt"))
		} else {
			require.Equal(t, before, after, "%s: a refused fork left a session: %v", fp, aerr)
		}
		require.Equal(t, owners(after), leaseOwners(), fp)
		waitArchived(t, name, after)
	}

	// Killed right after a destroy let its session go, before the rest of
	// its teardown (cgroup, root overlay, dir) began: the destroy answers
	// destroyed (the workflow's retry finds the session gone), and the
	// restarted daemon finishes the teardown from the record.
	before = sessions()
	doomed := d.must("create_workspace_session", nil)["workspace_session_id"].(string)
	d.must("file_write", map[string]any{"workspace_session_id": doomed, "path": "doomed.txt", "content": "x\n"})
	fpOut, fpErr := exec.Command("docker", "exec", name, "sh", "-c", "echo destroy-tail > /eos/layerstack/.failpoints").CombinedOutput()
	require.NoError(t, fpErr, "%s", fpOut)
	gone, aerr := d.op("destroy_workspace_session", map[string]any{"workspace_session_id": doomed})
	require.Nil(t, aerr, "a destroy whose daemon died after it let the session go: %v", aerr)
	require.Equal(t, true, gone["destroyed"], "%v", gone)
	require.Eventually(t, func() bool {
		if exec.Command("docker", "exec", name, "test", "!", "-e", "/eos/layerstack/.failpoints").Run() != nil {
			return false
		}
		_, err := d.op("list_workspace_sessions", nil) // the restarted daemon answers
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the destroy-tail failpoint never fired, or the daemon did not come back")
	require.Equal(t, before, sessions())
	require.Equal(t, owners(before), leaseOwners())
	waitArchived(t, name, before)
}

// waitArchived: the killed fork's session dir (without a record) is not
// left among the sessions (the restart archived it). The daemon's warm
// session (sandboxinit/warm.go) has a dir too, whose record says warm: it
// is not a session, and a restarted daemon may be building a new one (its
// dir is made just before its record), so this waits a little for the
// dirs to settle.
func waitArchived(t *testing.T, container string, after []string) {
	t.Helper()
	const list = `for d in /eos/sessions/*; do [ -d "$d" ] || continue; grep -qsE '"warm": *true' "$d/session.json" || basename "$d"; done`
	var dirs []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := exec.Command("docker", "exec", container, "sh", "-c", list).CombinedOutput()
		require.NoError(t, err, "%s", out)
		dirs = strings.Fields(string(out))
		sort.Strings(dirs)
		if strings.Join(dirs, " ") == strings.Join(after, " ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, after, dirs, "session dirs on the state volume")
}
