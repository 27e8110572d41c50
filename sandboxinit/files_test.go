package sandboxinit

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// TestFileEditBoundsTheResult: an edit whose result would exceed
// max_edit_bytes is resource_exhausted, in a session and without one, and
// nothing is written.
func TestFileEditBoundsTheResult(t *testing.T) {
	ctx := context.Background()
	mib := strings.Repeat("a", 1<<20)
	d := publishDaemon(t, t.TempDir(), map[string]string{"big.txt": mib})
	s := workSession(t, d, "ws-edit", nil)
	require.NoError(t, os.WriteFile(filepath.Join(s.merged(), "big.txt"), []byte(mib), 0o644))
	grow := []api.Edit{{OldString: "a", NewString: strings.Repeat("b", 100), ReplaceAll: true}}
	h := layers(t, d)
	for _, ws := range []string{"ws-edit", ""} {
		_, err := d.fileEdit(ctx, "r-"+ws, api.FileEditArgs{WorkspaceSessionID: ws, Path: "big.txt", Edits: grow})
		e := requireKind(t, err, api.KindResourceExhausted)
		require.Equal(t, "max_edit_bytes", e.Details["limit"], "%v", e)
		require.EqualValues(t, 4<<20, e.Details["max"])
		require.EqualValues(t, 100<<20, e.Details["size"])
	}
	b, err := os.ReadFile(filepath.Join(s.merged(), "big.txt"))
	require.NoError(t, err)
	require.Equal(t, mib, string(b), "the session's file is unchanged")
	require.Equal(t, mib, headFile(t, d, "big.txt"))
	require.Equal(t, h, layers(t, d), "nothing published")
}

// TestFileWriteConcurrently: writers of one path each replace it whole
// through a temporary file of their own: all succeed, the file is one of
// theirs, and no temporary file is left. A file a process made under the
// old, predictable temporary name blocks nothing and is left alone.
func TestFileWriteConcurrently(t *testing.T) {
	ctx := context.Background()
	d := publishDaemon(t, t.TempDir(), map[string]string{"f.txt": base10})
	s := workSession(t, d, "ws-w", nil)
	squat := filepath.Join(s.merged(), fmt.Sprintf(".out.txt.eos-write-%d", os.Getpid()))
	require.NoError(t, os.WriteFile(squat, []byte("squatter"), 0o644))

	const writers = 32
	contents := map[string]bool{}
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		c := strings.Repeat(fmt.Sprintf("writer %02d\n", i), 20000)
		contents[c] = true
		wg.Go(func() {
			_, errs[i] = d.fileWrite(ctx, fmt.Sprintf("r%d", i), api.FileWriteArgs{WorkspaceSessionID: "ws-w", Path: "out.txt", Content: c})
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "writer %d", i)
	}
	b, err := os.ReadFile(filepath.Join(s.merged(), "out.txt"))
	require.NoError(t, err)
	require.True(t, contents[string(b)], "the file is one writer's content, whole")
	ents, err := os.ReadDir(s.merged())
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"out.txt", filepath.Base(squat)}, names, "no temporary file left behind")
	b, err = os.ReadFile(squat)
	require.NoError(t, err)
	require.Equal(t, "squatter", string(b))
}

// mountedSession is workSession with its workspace mounted as in a real
// session: the overlay of its leased layers under its upper dir.
func mountedSession(t *testing.T, d *Daemon, id string) *session {
	t.Helper()
	s := workSession(t, d, id, nil)
	lease, err := d.store.Lease(s.rec.LeaseID)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(s.work(), 0o755))
	require.NoError(t, mountWorkspace(d.store.LowerDirs(lease), s.upper(), s.work(), s.merged()))
	t.Cleanup(func() { _ = unmountAll(s.merged()) })
	return s
}

// dirContent is a directory's content as path -> file content ("dir/" for
// a directory, the type of anything else), for comparing before and after.
func dirContent(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if e.IsDir() {
			out[rel+"/"] = ""
			return nil
		}
		if !e.Type().IsRegular() {
			out[rel] = e.Type().String()
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	}))
	return out
}

// TestFileMoveOverwriteFollowsRename: with overwrite a directory replaces
// only an empty directory and a file only a non-directory, as rename(2)
// has it; anything else is invalid_request naming the destination, before
// anything is copied, for a published (lower-layer) directory, one made in
// the session and on the head alike. A published directory is copied into
// place whole or not at all.
func TestFileMoveOverwriteFollowsRename(t *testing.T) {
	ctx := context.Background()
	base := map[string]string{"pub/a.txt": "a\n", "pub/sub/b.txt": "b\n", "full/x.txt": "x\n", "f.txt": "f\n", "other/y.txt": "y\n"}
	d := publishDaemon(t, t.TempDir(), base)
	s := mountedSession(t, d, "ws-mv")
	m := s.merged()
	require.NoError(t, os.MkdirAll(filepath.Join(m, "mine"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(m, "mine/m.txt"), []byte("m\n"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(m, "empty"), 0o755))
	move := func(ws, from, to string) error {
		_, err := d.fileMove(ctx, "r", api.FileMoveArgs{WorkspaceSessionID: ws, From: from, To: to, Overwrite: true})
		return err
	}

	for _, tc := range []struct {
		name, from, to, says string
	}{
		{"published dir onto a non-empty dir", "pub", "full", "full is a directory that is not empty"},
		{"session's dir onto a non-empty dir", "mine", "full", "full is a directory that is not empty"},
		{"dir onto a file", "pub", "f.txt", "f.txt is not a directory"},
		{"file onto a dir", "f.txt", "empty", "empty is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := dirContent(t, m)
			e := requireKind(t, move("ws-mv", tc.from, tc.to), api.KindInvalidRequest)
			require.True(t, strings.HasPrefix(e.Message, tc.says), "%v", e)
			require.Equal(t, tc.to, e.Details["to"])
			require.Equal(t, before, dirContent(t, m), "nothing changed")
		})
	}

	// The race rename(2) reports for a directory that is not empty.
	e := requireKind(t, moveError(api.FileMoveArgs{From: "mine", To: "full", Overwrite: true}, unix.ENOTEMPTY), api.KindInvalidRequest)
	require.Equal(t, "full", e.Details["to"])

	// A published directory with a FIFO in it refuses the copy: nothing
	// half-copied at the destination, no temporary copy beside it.
	require.NoError(t, unix.Mkfifo(filepath.Join(m, "other/pipe"), 0o644))
	before := dirContent(t, m)
	requireKind(t, move("ws-mv", "other", "moved-other"), api.KindInvalidRequest)
	require.Equal(t, before, dirContent(t, m), "nothing changed")
	require.NoError(t, os.Remove(filepath.Join(m, "other/pipe")))

	// Onto an empty directory, and onto nothing, it moves whole.
	require.NoError(t, move("ws-mv", "pub", "empty"))
	require.NoError(t, move("ws-mv", "other", "moved-other"))
	after := dirContent(t, m)
	require.Equal(t, map[string]string{"empty/": "", "empty/a.txt": "a\n", "empty/sub/": "", "empty/sub/b.txt": "b\n",
		"moved-other/": "", "moved-other/y.txt": "y\n", "full/": "", "full/x.txt": "x\n", "f.txt": "f\n", "mine/": "", "mine/m.txt": "m\n"}, after)

	// Without a session: the same rule, nothing published.
	h := layers(t, d)
	e = requireKind(t, move("", "pub", "full"), api.KindInvalidRequest)
	require.True(t, strings.HasPrefix(e.Message, "full is a directory that is not empty"), "%v", e)
	requireKind(t, move("", "f.txt", "pub"), api.KindInvalidRequest)
	require.Equal(t, h, layers(t, d))
	require.NoError(t, move("", "full/x.txt", "f.txt"))
	require.Equal(t, "x\n", headFile(t, d, "f.txt"))
}

// TestFileListOfAFile: listing a path that is a file says that path is not
// a directory (invalid_request), in a session and on the head; a path under
// a file still says it is a parent.
func TestFileListOfAFile(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"a.txt": "a\n"})
	s := workSession(t, d, "ws-ls", nil)
	require.NoError(t, os.WriteFile(filepath.Join(s.merged(), "a.txt"), []byte("a\n"), 0o644))
	for _, ws := range []string{"ws-ls", ""} {
		_, err := d.fileList(api.FileListArgs{WorkspaceSessionID: ws, Path: "a.txt"})
		e := requireKind(t, err, api.KindInvalidRequest)
		require.Equal(t, "a.txt is not a directory", e.Message, "session %q", ws)
		require.Equal(t, "a.txt", e.Details["path"])
	}
	_, err := d.fileList(api.FileListArgs{WorkspaceSessionID: "ws-ls", Path: "a.txt/b"})
	e := requireKind(t, err, api.KindInvalidRequest)
	require.Equal(t, "a parent of a.txt/b is not a directory", e.Message)
}

// TestExecRefusesNUL: a cmd with a NUL byte is the caller's mistake,
// refused before any session is made or used.
func TestExecRefusesNUL(t *testing.T) {
	d := publishDaemon(t, t.TempDir(), map[string]string{"a.txt": "a\n"})
	workSession(t, d, "ws-x", nil)
	for _, ws := range []string{"", "ws-x"} {
		_, err := d.exec(context.Background(), api.ExecCommandArgs{Cmd: "echo a\x00b", WorkspaceSessionID: ws})
		e := requireKind(t, err, api.KindInvalidRequest)
		require.Equal(t, "cmd", e.Details["arg"])
		for _, env := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A\x00": "x"}, {"A": "x\x00y"}, {"BIG": strings.Repeat("x", 200<<10)}} {
			_, err = d.exec(context.Background(), api.ExecCommandArgs{Cmd: "true", Env: env, WorkspaceSessionID: ws})
			e = requireKind(t, err, api.KindInvalidRequest)
			require.Equal(t, "env", e.Details["arg"], "%.40q", env)
		}
		// Too long for a command line: refused up front, not a failed start.
		_, err = d.exec(context.Background(), api.ExecCommandArgs{Cmd: "echo " + strings.Repeat("x", api.MaxCommandBytes), WorkspaceSessionID: ws})
		e = requireKind(t, err, api.KindInvalidRequest)
		require.Equal(t, "cmd", e.Details["arg"])
	}
	require.Len(t, d.listSessions(), 1, "no implicit session made")
}

// TestFileMoveWithoutSessionStreams: a sessionless move of a published
// tree publishes its files' content read from their layer files, not held
// in memory: a 16 MiB file costs far less than its size in allocations,
// and every byte, mode and link arrives.
func TestFileMoveWithoutSessionStreams(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<20)
	d := publishDaemon(t, t.TempDir(), map[string]string{"src/big.bin": big, "src/sub/s.txt": "s\n", "keep.txt": "k\n"})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := d.fileMove(context.Background(), "r", api.FileMoveArgs{From: "src", To: "dst"})
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(len(big)/2), "allocated %d bytes to move a %d-byte file", after.TotalAlloc-before.TotalAlloc, len(big))
	got, _, err := d.store.Head().ReadFile("dst/big.bin", 0)
	require.NoError(t, err)
	require.True(t, string(got) == big, "dst/big.bin has %d bytes, not the %d moved", len(got), len(big))
	require.Equal(t, "s\n", headFile(t, d, "dst/sub/s.txt"))
	_, err = d.store.Head().Stat("src")
	require.ErrorIs(t, err, fs.ErrNotExist)
}
