package layerstack

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestImportDirKeepsModesLinksAndSkipsSpecials(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, tree{"a.txt": "a", "bin/run*": "#!/bin/sh\n", "ln": "->a.txt", "abs": "->/etc/passwd", "empty/": ""})
	require.NoError(t, unix.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	parent := t.TempDir()
	info, rep, err := ImportDir(context.Background(), src, parent, ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, []Drop{{Path: "fifo", Reason: DropSpecialFile}}, rep.Skipped)
	require.Equal(t, tree{"a.txt": "a", "bin/": "", "bin/run*": "#!/bin/sh\n", "ln": "->a.txt", "abs": "->/etc/passwd", "empty/": ""}, dirTree(t, info.Path))
	st, err := os.Lstat(filepath.Join(src, "a.txt"))
	require.NoError(t, err)
	dt, err := os.Lstat(filepath.Join(info.Path, "a.txt"))
	require.NoError(t, err)
	require.Equal(t, st.ModTime(), dt.ModTime(), "mtimes survive")

	// Content addressed: the same tree again is the same base.
	info2, rep2, err := ImportDir(context.Background(), src, parent, ImportOptions{})
	require.NoError(t, err)
	require.True(t, rep2.Reused)
	require.Equal(t, info.ID, info2.ID)
}

func TestImportGitWorkTreeTakesTrackedAndUntrackedNotIgnored(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is needed for this test: apt-get install -y git")
	}
	src := t.TempDir()
	writeTree(t, src, tree{"tracked.go": "t\n", ".gitignore": "build/\n*.log\n!keep.log\n", "build/out.o": "o", "x.log": "l", "keep.log": "k", "untracked.go": "u\n", "forced.log": "f"})
	git := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.email=t@t", "-c", "user.name=t"}, args...)...)
		cmd.Dir = src
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	git("init", "-q")
	git("add", "tracked.go", ".gitignore")
	git("add", "-f", "forced.log")
	git("commit", "-qm", "init")
	parent := t.TempDir()
	info, rep, err := ImportDir(context.Background(), src, parent, ImportOptions{})
	require.NoError(t, err)
	require.True(t, rep.GitAware)
	got := dirTree(t, info.Path)
	for _, p := range []string{"tracked.go", ".gitignore", "keep.log", "untracked.go", "forced.log", ".git/HEAD"} {
		require.Contains(t, got, p)
	}
	for _, p := range []string{"build/out.o", "x.log"} {
		require.NotContains(t, got, p)
	}
	all, rep, err := ImportDir(context.Background(), src, parent, ImportOptions{All: true})
	require.NoError(t, err)
	require.False(t, rep.GitAware)
	require.Contains(t, dirTree(t, all.Path), "build/out.o")
}

func TestCaptureReadsEveryUpperEncoding(t *testing.T) {
	require.Equal(t, 0, os.Geteuid(), "needs root for mknod and trusted xattrs")
	up := t.TempDir()
	writeTree(t, up, tree{"f.txt": "f", "x*": "#!", "dir/": "", "ln": "->f.txt"})
	require.NoError(t, unix.Mknod(filepath.Join(up, "gone"), unix.S_IFCHR, 0))
	require.NoError(t, os.WriteFile(filepath.Join(up, "gone2"), nil, 0o644))
	require.NoError(t, unix.Setxattr(filepath.Join(up, "gone2"), xattrUserWhiteout, []byte("y"), 0))
	require.NoError(t, os.Mkdir(filepath.Join(up, "opq"), 0o750))
	require.NoError(t, os.Chmod(filepath.Join(up, "opq"), 0o750)) // whatever the umask
	require.NoError(t, unix.Setxattr(filepath.Join(up, "opq"), xattrTrustedOpaque, []byte("y"), 0))
	require.NoError(t, os.Mkdir(filepath.Join(up, "uopq"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(up, "uopq"), 0o755))
	require.NoError(t, unix.Setxattr(filepath.Join(up, "uopq"), xattrUserOpaque, []byte("y"), 0))
	require.NoError(t, unix.Mkfifo(filepath.Join(up, "pipe"), 0o644))
	cs, err := Capture(up)
	require.NoError(t, err)
	got := map[string]string{}
	for _, c := range cs.Changes {
		got[c.Path] = string(c.Kind) + ":" + c.Mode.String() + ":" + c.Target
	}
	require.Equal(t, map[string]string{
		"f.txt": "write:-rw-r--r--:", "x": "write:-rwxr-xr-x:", "dir": "dir:-rwxr-xr-x:", "ln": "symlink:----------:f.txt",
		"gone": "delete:----------:", "gone2": "delete:----------:", "opq": "opaque_dir:-rwxr-x---:", "uopq": "opaque_dir:-rwxr-xr-x:",
	}, got)
	require.Equal(t, []Drop{{Path: "pipe", Reason: DropSpecialFile}}, cs.Drops)
}

// Link imports the same base as a copy, by hard links on one filesystem,
// and the base stays whole once the source is gone.
func TestImportDirLink(t *testing.T) {
	fs := t.TempDir() // source and store on one filesystem
	src, parent := filepath.Join(fs, "src"), filepath.Join(fs, "store")
	require.NoError(t, os.MkdirAll(src, 0o755))
	writeTree(t, src, tree{"a.txt": "a\n", "bin/run*": "#!/bin/sh\n", "ln": "->a.txt", "d/e/f.txt": "f"})
	copied, _, err := ImportDir(context.Background(), src, t.TempDir(), ImportOptions{})
	require.NoError(t, err)
	linked, rep, err := ImportDir(context.Background(), src, parent, ImportOptions{Link: true})
	require.NoError(t, err)
	require.Equal(t, copied.ID, linked.ID, "the same content, the same base")
	require.Equal(t, 3, rep.Files)
	var s1, s2 unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(src, "d/e/f.txt"), &s1))
	require.NoError(t, unix.Stat(filepath.Join(linked.Path, "d/e/f.txt"), &s2))
	require.Equal(t, s1.Ino, s2.Ino, "a hard link, not a copy")
	require.NoError(t, os.RemoveAll(src))
	require.Equal(t, tree{"a.txt": "a\n", "bin/": "", "bin/run*": "#!/bin/sh\n", "ln": "->a.txt", "d/": "", "d/e/": "", "d/e/f.txt": "f"}, dirTree(t, linked.Path))

	// A setuid file or one owned by someone else is copied, so the base is
	// the one a copy makes (permission bits only, owned by the importer).
	src2, parent2 := filepath.Join(fs, "src2"), filepath.Join(fs, "store2")
	require.NoError(t, os.MkdirAll(src2, 0o755))
	writeTree(t, src2, tree{"suid": "s", "theirs": "t", "mine": "m"})
	require.NoError(t, os.Chmod(filepath.Join(src2, "suid"), 0o755|os.ModeSetuid))
	require.NoError(t, os.Chown(filepath.Join(src2, "theirs"), 1234, 1234))
	copied2, _, err := ImportDir(context.Background(), src2, t.TempDir(), ImportOptions{})
	require.NoError(t, err)
	linked2, _, err := ImportDir(context.Background(), src2, parent2, ImportOptions{Link: true})
	require.NoError(t, err)
	require.Equal(t, copied2.ID, linked2.ID)
	for name, wantLink := range map[string]bool{"suid": false, "theirs": false, "mine": true} {
		var a, b unix.Stat_t
		require.NoError(t, unix.Stat(filepath.Join(src2, name), &a))
		require.NoError(t, unix.Stat(filepath.Join(linked2.Path, name), &b))
		require.Equal(t, wantLink, a.Ino == b.Ino, name)
		if !wantLink {
			require.Zero(t, b.Mode&(unix.S_ISUID|unix.S_ISGID|unix.S_ISVTX), "%s: no special bits, as a copy", name)
			require.EqualValues(t, os.Getuid(), b.Uid, "%s: owned by the importer, as a copy", name)
		}
	}
}
