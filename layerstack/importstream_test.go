package layerstack

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/archive"
)

// tarOfDir writes dir as the worker streams a workspace: relative names,
// directories before what they hold, symlinks as links, special files
// skipped.
func tarOfDir(t testing.TB, dir string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		require.NoError(t, err)
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, err = os.Readlink(p)
			require.NoError(t, err)
		}
		if !fi.IsDir() && !fi.Mode().IsRegular() && link == "" {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		require.NoError(t, err)
		h.Name, h.Uname, h.Gname, h.Format = filepath.ToSlash(rel), "", "", tar.FormatPAX
		if fi.IsDir() {
			h.Name += "/"
		}
		require.NoError(t, tw.WriteHeader(h))
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			_, err = tw.Write(b)
			require.NoError(t, err)
		}
		return nil
	}))
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

type fileFacts struct {
	mode  fs.FileMode
	mtime time.Time
	data  string // contents or link target
}

// facts are a tree's paths with mode, mtime and contents.
func facts(t testing.TB, dir string) map[string]fileFacts {
	out := map[string]fileFacts{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		f := fileFacts{mode: fi.Mode(), mtime: fi.ModTime()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			f.data, err = os.Readlink(p)
			require.NoError(t, err)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			f.data = string(b)
		}
		out[rel] = f
		return nil
	}))
	return out
}

func richTree(t testing.TB) string {
	src := t.TempDir()
	writeTree(t, src, tree{"a.txt": "a", "bin/run*": "#!/bin/sh\n", "ln": "->a.txt", "abs": "->/etc/passwd",
		"up": "->../../outside", "empty/": "", "deep/er/still/x.go": "package x\n", "ro.txt": "r", "dirlink": "->deep"})
	big := make([]byte, 5<<20+123)
	_, _ = rand.Read(big)
	require.NoError(t, os.WriteFile(filepath.Join(src, "deep/big.bin"), big, 0o640))
	require.NoError(t, os.Chmod(filepath.Join(src, "ro.txt"), 0o444))
	// Modes a usual umask (022) would cut: the import must not.
	require.NoError(t, os.WriteFile(filepath.Join(src, "shared.txt"), []byte("s"), 0o600))
	require.NoError(t, os.Chmod(filepath.Join(src, "shared.txt"), 0o666))
	require.NoError(t, os.WriteFile(filepath.Join(src, "deep/all"), []byte("x"), 0o600))
	require.NoError(t, os.Chmod(filepath.Join(src, "deep/all"), 0o777))
	require.NoError(t, os.Chmod(filepath.Join(src, "deep/er"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(src, "zero"), nil, 0o600))
	writeSparse(t, filepath.Join(src, "deep/disk.img"))
	require.NoError(t, unix.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	old := time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)
	for _, p := range []string{"a.txt", "deep/er", "empty", "deep"} {
		require.NoError(t, os.Chtimes(filepath.Join(src, p), old, old))
	}
	return src
}

// The streamed import yields the base the directory import yields for the
// same tree: same id and digest, same files, modes, mtimes and links.
func TestImportStreamMatchesImportDir(t *testing.T) {
	src := richTree(t)
	dirParent, streamParent := t.TempDir(), t.TempDir()
	want, wantRep, err := ImportDir(context.Background(), src, dirParent, ImportOptions{})
	require.NoError(t, err)
	got, rep, err := ImportStream(context.Background(), bytes.NewReader(tarOfDir(t, src)), streamParent, StreamImportOptions{})
	require.NoError(t, err)
	require.Equal(t, want.ID, got.ID)
	require.Equal(t, want.RootHash, got.RootHash)
	require.Equal(t, want.Counts, got.Counts)
	require.Equal(t, want.Bytes, got.Bytes)
	require.Equal(t, facts(t, want.Path), facts(t, got.Path))
	require.Equal(t, wantRep.Files, rep.Files)
	require.Equal(t, wantRep.Dirs, rep.Dirs)
	require.Equal(t, wantRep.Symlinks, rep.Symlinks)
	require.Equal(t, wantRep.Bytes, rep.Bytes)
	// The digest computed while writing is the one a re-read computes.
	digest, counts, n, err := treeDigest(got.Path)
	require.NoError(t, err)
	require.Equal(t, got.RootHash, digest)
	require.Equal(t, got.Counts, counts)
	require.Equal(t, got.Bytes, n)
	ents, err := os.ReadDir(streamParent)
	require.NoError(t, err)
	for _, e := range ents {
		require.NotContains(t, e.Name(), ".import-", "no staging left behind")
	}
	// A sparse file stays sparse in either base.
	for _, base := range []string{want.Path, got.Path} {
		requireSparse(t, filepath.Join(base, "deep/disk.img"))
	}
}

// writeSparse makes a file of 8 MiB and 100 bytes that holds a few bytes
// at 1 MiB and a hole everywhere else, ending in one.
func writeSparse(t testing.TB, p string) {
	f, err := os.Create(p)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("data in a sparse file"), 1<<20)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(8<<20+100))
	require.NoError(t, f.Close())
}

// requireSparse checks that p holds at most 64 KiB of disk, whatever its size.
func requireSparse(t testing.TB, p string) {
	var st unix.Stat_t
	require.NoError(t, unix.Stat(p, &st))
	require.Greater(t, st.Size, int64(8<<20))
	require.LessOrEqual(t, st.Blocks*512, int64(64<<10), "%s: %d bytes of disk for %d bytes", p, st.Blocks*512, st.Size)
}

func TestImportStreamGitAwareMatchesImportDir(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is needed for this test: apt-get install -y git")
	}
	src := t.TempDir()
	writeTree(t, src, tree{"tracked.go": "t\n", ".gitignore": "build/\n*.log\n!keep.log\nignored-dir/\n", "build/out.o": "o", "x.log": "l",
		"keep.log": "k", "untracked.go": "u\n", "forced.log": "f", "ignored-dir/a/b": "b", "sub/keep/y.go": "y", "sub/gone.log": "g", "emptydir/": ""})
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
	want, wantRep, err := ImportDir(context.Background(), src, t.TempDir(), ImportOptions{})
	require.NoError(t, err)
	require.True(t, wantRep.GitAware)
	got, rep, err := ImportStream(context.Background(), bytes.NewReader(tarOfDir(t, src)), t.TempDir(), StreamImportOptions{})
	require.NoError(t, err)
	require.True(t, rep.GitAware)
	require.Equal(t, want.ID, got.ID)
	require.Equal(t, facts(t, want.Path), facts(t, got.Path))
	require.Equal(t, wantRep.Files, rep.Files)
	require.Equal(t, wantRep.Dirs, rep.Dirs)
	require.NotContains(t, facts(t, got.Path), "build/out.o")
	require.NotContains(t, facts(t, got.Path), "emptydir")

	// All takes the ignored files too, as ImportDir's All does.
	wantAll, _, err := ImportDir(context.Background(), src, t.TempDir(), ImportOptions{All: true})
	require.NoError(t, err)
	gotAll, _, err := ImportStream(context.Background(), bytes.NewReader(tarOfDir(t, src)), t.TempDir(), StreamImportOptions{All: true})
	require.NoError(t, err)
	require.Equal(t, wantAll.ID, gotAll.ID)
}

type entry struct {
	hdr  tar.Header
	data string
}

func tarOf(t testing.TB, ents ...entry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		require.NoError(t, tw.WriteHeader(&h))
		if e.data != "" {
			_, err := tw.Write([]byte(e.data))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func reg(name, data string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg}, data: data}
}
func dir(name string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}}
}
func sym(name, target string) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target}}
}

// A hostile stream is refused with a structured reason, and nothing of it
// is left: not outside the import, not in the parent.
func TestImportStreamRefusesMaliciousEntries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ents   []entry
		raw    []byte
		reason string
		limits archive.ApplyLimits
	}{
		{name: "parent traversal", ents: []entry{reg("../escape", "x")}, reason: archive.ReasonParentTraversal},
		{name: "deep traversal", ents: []entry{dir("a/"), reg("a/../../escape", "x")}, reason: archive.ReasonParentTraversal},
		{name: "absolute", ents: []entry{reg("/tmp/escape", "x")}, reason: archive.ReasonAbsolutePath},
		{name: "through a symlink", ents: []entry{sym("out", "/tmp"), reg("out/escape", "x")}, reason: archive.ReasonSymlinkInPath},
		{name: "through a relative symlink", ents: []entry{sym("out", "../.."), reg("out/escape", "x")}, reason: archive.ReasonSymlinkInPath},
		{name: "dir through a symlink", ents: []entry{sym("out", "/tmp"), dir("out/d/")}, reason: archive.ReasonSymlinkInPath},
		{name: "symlink through a symlink", ents: []entry{sym("out", "/tmp"), sym("out/l", "x")}, reason: archive.ReasonSymlinkInPath},
		{name: "file over a symlink", ents: []entry{sym("l", "/etc/passwd"), reg("l", "x")}, reason: archive.ReasonDuplicateEntry},
		{name: "repeated file", ents: []entry{reg("f", "1"), reg("f", "2")}, reason: archive.ReasonDuplicateEntry},
		{name: "file under a file", ents: []entry{reg("f", "1"), reg("f/g", "2")}, reason: archive.ReasonParentNotDir},
		{name: "dir over a file", ents: []entry{reg("f", "1"), dir("f/")}, reason: archive.ReasonParentNotDir},
		{name: "file over a dir", ents: []entry{dir("d/"), reg("d", "1")}, reason: archive.ReasonDuplicateEntry},
		{name: "hard link", ents: []entry{reg("f", "1"), {hdr: tar.Header{Name: "g", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}}}, reason: archive.ReasonUnsupportedEntry},
		{name: "file too large", ents: []entry{reg("f", "12345")}, reason: archive.ReasonFileTooLarge, limits: archive.ApplyLimits{MaxFileBytes: 4}},
		{name: "too many bytes", ents: []entry{reg("f", "123"), reg("g", "123")}, reason: archive.ReasonTooManyBytes, limits: archive.ApplyLimits{MaxBytes: 5}},
		{name: "too many entries", ents: []entry{reg("f", "1"), reg("g", "1"), reg("h", "1")}, reason: archive.ReasonTooManyEntries, limits: archive.ApplyLimits{MaxEntries: 2}},
		{name: "long name", ents: []entry{reg(string(bytes.Repeat([]byte("a"), 300)), "x")}, reason: archive.ReasonPathTooLong},
		{name: "truncated", raw: tarOf(t, reg("f", "hello world"))[:600], reason: archive.ReasonBadStream},
		{name: "cut at an entry boundary", raw: tarOf(t, reg("f", "hello world"), reg("g", "x"))[:1024], reason: archive.ReasonBadStream},
		{name: "cut mid data", raw: tarOf(t, reg("f", string(bytes.Repeat([]byte("x"), 5000))))[:2048], reason: archive.ReasonBadStream},
		{name: "garbage", raw: bytes.Repeat([]byte{0xff}, 2048), reason: archive.ReasonBadStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outside := t.TempDir()
			parent := filepath.Join(outside, "base")
			raw := tc.raw
			if raw == nil {
				raw = tarOf(t, tc.ents...)
			}
			_, _, err := ImportStream(context.Background(), bytes.NewReader(raw), parent, StreamImportOptions{Limits: tc.limits})
			var ae *archive.ApplyError
			require.True(t, errors.As(err, &ae), "%v", err)
			require.Equal(t, tc.reason, ae.Reason, "%v", err)
			ents, err := os.ReadDir(parent)
			require.NoError(t, err)
			require.Empty(t, ents, "nothing left in the parent")
			ents, err = os.ReadDir(outside)
			require.NoError(t, err)
			require.Len(t, ents, 1, "nothing written beside it")
			_, err = os.Lstat("/tmp/escape")
			require.True(t, os.IsNotExist(err))
		})
	}
}

// Entries a layer cannot hold and special files are skipped and reported,
// as the directory import does; implicit parents are made.
func TestImportStreamSkipsWhatALayerCannotHold(t *testing.T) {
	raw := tarOf(t, reg(".wh.f", "x"), dir("d/"), reg("d/.wh..wh..opq", ""), reg("bad\xffname", "x"),
		entry{hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}}, entry{hdr: tar.Header{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		reg("implicit/parent/f", "y"), entry{hdr: tar.Header{Name: "setuid", Typeflag: tar.TypeReg, Mode: 0o4755}, data: "s"})
	info, rep, err := ImportStream(context.Background(), bytes.NewReader(raw), t.TempDir(), StreamImportOptions{})
	require.NoError(t, err)
	require.ElementsMatch(t, []Drop{{Path: ".wh.f", Reason: DropInvalidPath}, {Path: "d/.wh..wh..opq", Reason: DropInvalidPath},
		{Path: "bad\xffname", Reason: DropInvalidPath}, {Path: "fifo", Reason: DropSpecialFile}, {Path: "dev", Reason: DropSpecialFile}}, rep.Skipped)
	require.Equal(t, tree{"d/": "", "implicit/": "", "implicit/parent/": "", "implicit/parent/f": "y", "setuid*": "s"}, dirTree(t, info.Path))
	fi, err := os.Stat(filepath.Join(info.Path, "setuid"))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o755), fi.Mode(), "no setuid bit")
	digest, _, _, err := treeDigest(info.Path)
	require.NoError(t, err)
	require.Equal(t, info.RootHash, digest)
}

// A stream that fails half way (a broken connection) leaves nothing.
func TestImportStreamCutMidFileLeavesNothing(t *testing.T) {
	raw := tarOf(t, dir("d/"), reg("d/f", string(bytes.Repeat([]byte("x"), 100000))))
	parent := t.TempDir()
	r := io.MultiReader(bytes.NewReader(raw[:50000]), iotestErrReader{})
	_, _, err := ImportStream(context.Background(), r, parent, StreamImportOptions{})
	require.Error(t, err)
	ents, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Empty(t, ents)
}

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// FuzzImportStream: whatever the stream, the import either makes a base
// whose digest a re-read confirms, or fails and leaves nothing; it never
// writes beside the parent.
func FuzzImportStream(f *testing.F) {
	f.Add(tarOf(f, dir("d/"), reg("d/f", "x"), sym("l", "d/f")))
	f.Add(tarOf(f, sym("out", "/tmp"), reg("out/escape", "x")))
	f.Add(tarOf(f, reg("../escape", "x")))
	f.Add(tarOf(f, reg("f", "1"), reg("f/g", "2")))
	f.Add(tarOf(f, reg(".wh.f", "x"), entry{hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		outside := t.TempDir()
		parent := filepath.Join(outside, "base")
		info, _, err := ImportStream(context.Background(), bytes.NewReader(raw), parent,
			StreamImportOptions{All: true, Limits: archive.ApplyLimits{MaxEntries: 200, MaxBytes: 1 << 20}})
		ents, rerr := os.ReadDir(outside)
		require.NoError(t, rerr)
		require.Len(t, ents, 1, "nothing beside the parent")
		if err != nil {
			left, rerr := os.ReadDir(parent)
			require.NoError(t, rerr)
			require.Empty(t, left, "a failed import leaves nothing: %v", err)
			return
		}
		digest, _, _, err := treeDigest(info.Path)
		require.NoError(t, err)
		require.Equal(t, info.RootHash, digest)
	})
}
