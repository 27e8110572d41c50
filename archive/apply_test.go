package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// tte describes one tar entry for tests.
type tte struct {
	name  string
	typ   byte
	body  string
	mode  int64
	link  string
	mtime time.Time
}

var taMtime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

func tFile(name, body string) tte { return tte{name: name, typ: tar.TypeReg, body: body, mode: 0o644} }
func tDir(name string) tte        { return tte{name: name, typ: tar.TypeDir, mode: 0o755} }
func tSymlink(name, target string) tte {
	return tte{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func tHardlink(name, target string) tte { return tte{name: name, typ: tar.TypeLink, link: target} }
func tWhiteout(name string) tte         { return tFile(name, "") }

func (e tte) header() *tar.Header {
	mt := e.mtime
	if mt.IsZero() {
		mt = taMtime
	}
	h := &tar.Header{
		Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link,
		ModTime: mt, Uid: 1234, Gid: 5678, Format: tar.FormatPAX,
	}
	if e.typ == tar.TypeReg {
		h.Size = int64(len(e.body))
	}
	return h
}

func taBuildTar(t testing.TB, entries ...tte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		require.NoError(t, tw.WriteHeader(e.header()), e.name)
		if e.typ == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func taZstd(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	require.NoError(t, err)
	_, err = zw.Write(data)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

// taRawHeader builds a ustar header block by hand, for streams archive/tar
// refuses to write.
func taRawHeader(name string, typ byte, size int) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], fmt.Sprintf("%011o\x00", taMtime.Unix()))
	copy(b[148:156], "        ")
	b[156] = typ
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func taPadBlock(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}

// taPaxNULName is a stream whose PAX path record contains a NUL byte.
func taPaxNULName() []byte {
	rec := "12 path=a\x00b\n"
	var out []byte
	out = append(out, taRawHeader("PaxHeaders/x", tar.TypeXHeader, len(rec))...)
	out = append(out, taPadBlock([]byte(rec))...)
	out = append(out, taRawHeader("x", tar.TypeReg, 0)...)
	return append(out, make([]byte, 1024)...)
}

func taApply(t testing.TB, data []byte, dest string, opts ApplyOptions) (ApplyReport, error) {
	t.Helper()
	return ApplyTar(context.Background(), bytes.NewReader(data), dest, opts)
}

// taSnapshot describes every entry below root (without following symlinks).
func taSnapshot(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v %d", info.Mode(), info.ModTime().UnixNano())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += " " + hex.EncodeToString(sum[:])
		}
		out[rel] = desc
		return nil
	})
	require.NoError(t, err)
	return out
}

// taListTree lists entries below root as "path" (dir "path/", symlink
// "path -> target").
func taListTree(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			rel += " -> " + target
		case d.IsDir():
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	require.NoError(t, err)
	return out
}

func taWriteTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		if target, ok := strings.CutPrefix(body, "->"); ok {
			require.NoError(t, os.Symlink(target, p))
			continue
		}
		if strings.HasSuffix(name, "/") {
			continue
		}
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
}

func taReadFile(t testing.TB, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	return string(data)
}

func taRequireApplyError(t testing.TB, err error, phase, reason string) *ApplyError {
	t.Helper()
	var ae *ApplyError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, reason, ae.Reason, "error: %v", err)
	require.Equal(t, phase, ae.Phase, "error: %v", err)
	return ae
}

func TestApplyTarRoundTrip(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "dest") // absent: created by ApplyTar
	nsTime := time.Date(2023, 5, 6, 7, 8, 9, 123456789, time.UTC)
	data := taBuildTar(t,
		tte{name: "./", typ: tar.TypeDir, mode: 0o700},
		tte{name: "d/", typ: tar.TypeDir, mode: 0o750, mtime: nsTime},
		tte{name: "d/a.txt", typ: tar.TypeReg, body: "hello", mode: 0o640, mtime: nsTime},
		tte{name: "d/run.sh", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o4755 | 0o2000 | 0o1000},
		tte{name: "./top", typ: tar.TypeReg, body: "top", mode: 0o600},
		tte{name: "d/empty", typ: tar.TypeReg, mode: 0o444},
		tSymlink("d/rel", "a.txt"),
		tSymlink("abs", "/etc/passwd"),
		tHardlink("d/hard", "d/a.txt"),
		tHardlink("./d/hard2", "d/hard"),
		tFile("implicit//deep/f", "deep"),
		tte{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		tFile("ro/inner", "x"),
	)
	rep, err := taApply(t, data, dest, ApplyOptions{})
	require.NoError(t, err)
	require.Equal(t, ApplyReport{
		FilesWritten: 8, SymlinksWritten: 2, DirsCreated: 4,
		BytesWritten: int64(len("hello")*3 + len("#!/bin/sh\n") + len("top") + len("deep") + 1),
	}, rep)

	require.Equal(t, []string{
		"abs -> /etc/passwd", "d/", "d/a.txt", "d/empty", "d/hard", "d/hard2", "d/rel -> a.txt", "d/run.sh",
		"implicit/", "implicit/deep/", "implicit/deep/f", "ro/", "ro/inner", "top",
	}, taListTree(t, dest))
	require.Equal(t, "hello", taReadFile(t, filepath.Join(dest, "d/hard")))
	require.Equal(t, "hello", taReadFile(t, filepath.Join(dest, "d/hard2")))
	require.Equal(t, "deep", taReadFile(t, filepath.Join(dest, "implicit/deep/f")))

	modes := map[string]fs.FileMode{
		"d": fs.ModeDir | 0o750, "d/a.txt": 0o640, "d/run.sh": 0o755, "top": 0o600,
		"d/empty": 0o444, "d/hard": 0o640, "ro": fs.ModeDir | 0o555,
	}
	for name, want := range modes {
		fi, err := os.Lstat(filepath.Join(dest, name))
		require.NoError(t, err)
		require.Equal(t, want, fi.Mode(), name)
	}
	mtimes := map[string]time.Time{
		"d": nsTime, "d/a.txt": nsTime, "d/hard": nsTime, "top": taMtime,
		"d/rel": taMtime, "abs": taMtime, "ro": taMtime,
	}
	for name, want := range mtimes {
		fi, err := os.Lstat(filepath.Join(dest, name))
		require.NoError(t, err)
		require.True(t, want.Equal(fi.ModTime()), "%s: mtime %v, want %v", name, fi.ModTime(), want)
	}
	var st unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(dest, "d/hard"), &st))
	require.EqualValues(t, 1, st.Nlink, "hardlinks are applied as copies")
}

func TestApplyTarLongNames(t *testing.T) {
	long := strings.Repeat("long-directory-name/", 12) + "file.txt"
	for _, format := range []tar.Format{tar.FormatPAX, tar.FormatGNU} {
		t.Run(format.String(), func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: long, Typeflag: tar.TypeReg, Size: 2,
				Mode: 0o644, ModTime: taMtime, Format: format}))
			_, err := tw.Write([]byte("ok"))
			require.NoError(t, err)
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink,
				Linkname: "/" + long, ModTime: taMtime, Format: format}))
			require.NoError(t, tw.Close())

			dest := t.TempDir()
			_, err = taApply(t, buf.Bytes(), dest, ApplyOptions{})
			require.NoError(t, err)
			require.Equal(t, "ok", taReadFile(t, filepath.Join(dest, long)))
			target, err := os.Readlink(filepath.Join(dest, "l"))
			require.NoError(t, err)
			require.Equal(t, "/"+long, target)
		})
	}
}

func TestApplyReportJSON(t *testing.T) {
	data, err := json.Marshal(ApplyReport{FilesWritten: 1, Skipped: []SkippedEntry{{Path: "p", Reason: "r"}}})
	require.NoError(t, err)
	require.JSONEq(t, `{"files_written":1,"symlinks_written":0,"dirs_created":0,"deletes_applied":0,
		"opaque_clears":0,"skipped_unchanged":0,"bytes_written":0,"skipped":[{"path":"p","reason":"r"}]}`, string(data))
}

func TestApplyTarZstd(t *testing.T) {
	dest := t.TempDir()
	data := taZstd(t, taBuildTar(t, tDir("z/"), tFile("z/f", strings.Repeat("zstd ", 1000))))
	rep, err := taApply(t, data, dest, ApplyOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, rep.FilesWritten)
	require.Equal(t, strings.Repeat("zstd ", 1000), taReadFile(t, filepath.Join(dest, "z/f")))
}

func TestApplyTarWhiteouts(t *testing.T) {
	tests := []struct {
		name    string
		before  map[string]string
		stream  []tte
		want    []string
		deletes int
		opaque  int
	}{{
		name:    "file and directory whiteouts",
		before:  map[string]string{"a/keep": "k", "a/del": "d", "b/x/y": "y", "c": "c"},
		stream:  []tte{tWhiteout("a/.wh.del"), tWhiteout(".wh.b"), tWhiteout("./.wh.missing")},
		want:    []string{"a/", "a/keep", "c"},
		deletes: 2,
	}, {
		name:   "opaque marker after the directory's entries",
		before: map[string]string{"o/old": "1", "o/sub/old2": "2", "other": "3"},
		stream: []tte{tDir("o/"), tFile("o/new", "n"), tFile("o/sub2/n2", "n2"), tWhiteout("o/.wh..wh..opq")},
		want:   []string{"o/", "o/new", "o/sub2/", "o/sub2/n2", "other"},
		opaque: 1,
	}, {
		name:   "opaque marker before entries, no directory entry",
		before: map[string]string{"o/old": "1"},
		stream: []tte{tWhiteout("o/.wh..wh..opq"), tFile("o/new", "n")},
		want:   []string{"o/", "o/new"},
		opaque: 1,
	}, {
		name:   "opaque root",
		before: map[string]string{"x": "1", "y/z": "2"},
		stream: []tte{tFile("n", "n"), tWhiteout(".wh..wh..opq")},
		want:   []string{"n"},
		opaque: 1,
	}, {
		name:    "whiteout then re-add",
		before:  map[string]string{"r/old": "1"},
		stream:  []tte{tFile("r/new", "n"), tWhiteout(".wh.r")},
		want:    []string{"r/", "r/new"},
		deletes: 1,
	}, {
		name:    "whiteouts inside a removed directory are no-ops",
		before:  map[string]string{"g/h/i": "1"},
		stream:  []tte{tWhiteout(".wh.g"), tWhiteout("g/h/.wh.i"), tWhiteout("g/.wh..wh..opq")},
		want:    nil,
		deletes: 1,
	}, {
		name:    "whiteout of a symlink removes only the link",
		before:  map[string]string{"l": "->OUTSIDE"},
		stream:  []tte{tWhiteout(".wh.l")},
		want:    nil,
		deletes: 1,
	}, {
		name:   "directory entry replaces a dest symlink, whiteouts under it are no-ops",
		before: map[string]string{"l": "->OUTSIDE"},
		stream: []tte{tWhiteout("l/.wh.target.txt"), tDir("l/"), tFile("l/f", "f"), tWhiteout("l/.wh..wh..opq")},
		want:   []string{"l/", "l/f"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dest, outside := filepath.Join(parent, "dest"), filepath.Join(parent, "outside")
			taWriteTree(t, outside, map[string]string{"target.txt": "outside"})
			before := map[string]string{}
			for k, v := range tc.before {
				before[k] = strings.ReplaceAll(v, "OUTSIDE", outside)
			}
			taWriteTree(t, dest, before)
			outsideBefore := taSnapshot(t, outside)

			rep, err := taApply(t, taBuildTar(t, tc.stream...), dest, ApplyOptions{})
			require.NoError(t, err)
			require.Equal(t, tc.want, taListTree(t, dest))
			require.Equal(t, tc.deletes, rep.DeletesApplied)
			require.Equal(t, tc.opaque, rep.OpaqueClears)
			require.Equal(t, outsideBefore, taSnapshot(t, outside))
		})
	}
}

func TestApplyTarReplacesExisting(t *testing.T) {
	parent := t.TempDir()
	dest, outside := filepath.Join(parent, "dest"), filepath.Join(parent, "outside")
	taWriteTree(t, outside, map[string]string{"target.txt": "outside"})
	taWriteTree(t, dest, map[string]string{
		"was-file":    "f",
		"was-dir/x/y": "y",
		"via-link":    "->" + filepath.Join(outside, "target.txt"),
		"link-dir":    "->" + outside,
		"old-link":    "->somewhere",
	})
	outsideBefore := taSnapshot(t, outside)
	data := taBuildTar(t,
		tDir("was-file/"), tFile("was-file/in", "in"),
		tFile("was-dir", "now a file"),
		tFile("via-link", "not through the link"),
		tDir("link-dir/"), tFile("link-dir/target.txt", "inside"),
		tSymlink("old-link", "new-target"),
	)
	_, err := taApply(t, data, dest, ApplyOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{
		"link-dir/", "link-dir/target.txt", "old-link -> new-target", "via-link",
		"was-dir", "was-file/", "was-file/in",
	}, taListTree(t, dest))
	require.Equal(t, "not through the link", taReadFile(t, filepath.Join(dest, "via-link")))
	require.Equal(t, outsideBefore, taSnapshot(t, outside))
}

func TestApplyTarSkipUnchanged(t *testing.T) {
	dest := t.TempDir()
	data := taBuildTar(t, tFile("a", "same"), tFile("b", "bbbb"), tte{name: "c", typ: tar.TypeReg, body: "cc", mode: 0o600})
	_, err := taApply(t, data, dest, ApplyOptions{})
	require.NoError(t, err)

	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, os.Chtimes(filepath.Join(dest, "a"), old, old))
	require.NoError(t, os.WriteFile(filepath.Join(dest, "b"), []byte("BBBB"), 0o644)) // same size, new content
	require.NoError(t, os.Chmod(filepath.Join(dest, "c"), 0o644))                     // same content, new mode

	rep, err := taApply(t, data, dest, ApplyOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, rep.SkippedUnchanged)
	require.Equal(t, 2, rep.FilesWritten)
	require.Equal(t, int64(6), rep.BytesWritten)
	fi, err := os.Stat(filepath.Join(dest, "a"))
	require.NoError(t, err)
	require.True(t, old.Equal(fi.ModTime()), "unchanged file left alone")
	require.Equal(t, "bbbb", taReadFile(t, filepath.Join(dest, "b")))
	fi, err = os.Stat(filepath.Join(dest, "c"))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode())
}

func TestApplyTarRepeatedDirectory(t *testing.T) {
	dest := t.TempDir()
	data := taBuildTar(t, tte{name: "d", typ: tar.TypeDir, mode: 0o700}, tFile("d/f", "f"),
		tte{name: "d/", typ: tar.TypeDir, mode: 0o751})
	rep, err := taApply(t, data, dest, ApplyOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, rep.DirsCreated)
	fi, err := os.Stat(filepath.Join(dest, "d"))
	require.NoError(t, err)
	require.Equal(t, fs.ModeDir|0o751, fi.Mode())
}

func TestApplyTarImportSpecialFiles(t *testing.T) {
	dest := t.TempDir()
	data := taBuildTar(t,
		tFile("f", "data"),
		tte{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		tte{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660},
		tte{name: "pipe", typ: tar.TypeFifo, mode: 0o644},
	)
	rep, err := taApply(t, data, dest, ApplyOptions{Mode: ApplyImport})
	require.NoError(t, err)
	require.Equal(t, []SkippedEntry{
		{Path: "dev/null", Reason: SkipReasonSpecialFile},
		{Path: "dev/sda", Reason: SkipReasonSpecialFile},
		{Path: "pipe", Reason: SkipReasonSpecialFile},
	}, rep.Skipped)
	require.Equal(t, []string{"f"}, taListTree(t, dest))
}

func TestApplyTarCanceled(t *testing.T) {
	dest := t.TempDir()
	taWriteTree(t, dest, map[string]string{"keep": "k"})
	before := taSnapshot(t, dest)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := ApplyTar(ctx, bytes.NewReader(taBuildTar(t, tFile("f", "x"))), dest, ApplyOptions{})
	taRequireApplyError(t, err, PhaseValidate, ReasonCanceled)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, before, taSnapshot(t, dest))
}

// taHostileCase is one stream that must be rejected before dest is touched.
type taHostileCase struct {
	name   string
	data   func(t testing.TB) []byte
	opts   ApplyOptions
	empty  bool // start from an empty dest (import mode)
	reason string
}

func taTarOf(entries ...tte) func(testing.TB) []byte {
	return func(t testing.TB) []byte { return taBuildTar(t, entries...) }
}

func taHostileCases() []taHostileCase {
	good := tFile("good.txt", "written only if the stream is accepted")
	long := strings.Repeat("n", 300)
	return []taHostileCase{
		{name: "absolute path", data: taTarOf(good, tFile("/etc/evil", "x")), reason: ReasonAbsolutePath},
		{name: "parent traversal", data: taTarOf(good, tFile("../x", "x")), reason: ReasonParentTraversal},
		{name: "nested traversal", data: taTarOf(good, tFile("a/../../x", "x")), reason: ReasonParentTraversal},
		{name: "traversal that stays inside", data: taTarOf(tFile("a/../b", "x")), reason: ReasonParentTraversal},
		// archive/tar itself refuses a NUL in a PAX path record.
		{name: "NUL in name", data: func(testing.TB) []byte { return taPaxNULName() }, reason: ReasonBadStream},
		{name: "symlink to root then write through it",
			data: taTarOf(good, tSymlink("a", "/"), tFile("a/etc/passwd", "x")), reason: ReasonSymlinkInPath},
		{name: "symlink to parent then write through it",
			data: taTarOf(tSymlink("up", ".."), tFile("up/escaped", "x")), reason: ReasonSymlinkInPath},
		{name: "symlink to parent then directory through it",
			data: taTarOf(tSymlink("up", ".."), tDir("up/d/")), reason: ReasonSymlinkInPath},
		{name: "symlink declared after entries under it",
			data: taTarOf(tFile("s/f", "x"), tSymlink("s", "/tmp")), reason: ReasonSymlinkInPath},
		{name: "write through pre-existing dest symlink",
			data: taTarOf(good, tFile("link/target.txt", "pwned")), reason: ReasonSymlinkInPath},
		{name: "create under pre-existing dest symlink",
			data: taTarOf(good, tFile("link/new/deep", "pwned")), reason: ReasonSymlinkInPath},
		{name: "whiteout through pre-existing dest symlink",
			data: taTarOf(good, tWhiteout("link/.wh.target.txt")), reason: ReasonSymlinkInPath},
		{name: "opaque through pre-existing dest symlink",
			data: taTarOf(good, tWhiteout("link/.wh..wh..opq")), reason: ReasonSymlinkInPath},
		{name: "file below a dest file", data: taTarOf(good, tFile("existing.txt/x", "x")), reason: ReasonParentNotDir},
		{name: "hardlink to /etc/passwd", data: taTarOf(good, tHardlink("h", "/etc/passwd")), reason: ReasonLinkEscapes},
		{name: "hardlink to missing entry", data: taTarOf(good, tHardlink("h", "nope")), reason: ReasonLinkEscapes},
		{name: "hardlink to dest file", data: taTarOf(good, tHardlink("h", "existing.txt")), reason: ReasonLinkEscapes},
		{name: "hardlink upwards", data: taTarOf(good, tHardlink("h", "../outside/target.txt")), reason: ReasonLinkEscapes},
		{name: "hardlink to later entry", data: taTarOf(tHardlink("h", "later"), tFile("later", "x")), reason: ReasonLinkEscapes},
		{name: "hardlink to symlink", data: taTarOf(tSymlink("s", "/etc/passwd"), tHardlink("h", "s")), reason: ReasonLinkEscapes},
		{name: "truncated mid-entry", data: func(t testing.TB) []byte {
			b := taBuildTar(t, good, tFile("big", strings.Repeat("x", 5000)))
			return b[:len(b)-3000]
		}, reason: ReasonBadStream},
		{name: "truncated at a block boundary", data: func(t testing.TB) []byte {
			b := taBuildTar(t, good, tFile("b", "x"))
			return b[:len(b)-1024]
		}, reason: ReasonBadStream},
		{name: "one trailer block", data: func(t testing.TB) []byte {
			b := taBuildTar(t, good)
			return b[:len(b)-512]
		}, reason: ReasonBadStream},
		{name: "truncated zstd", data: func(t testing.TB) []byte {
			z := taZstd(t, taBuildTar(t, good, tFile("f", strings.Repeat("abc", 10000))))
			return z[:len(z)-8]
		}, reason: ReasonBadStream},
		{name: "garbage", data: func(testing.TB) []byte {
			return bytes.Repeat([]byte("not a tar stream "), 100)
		}, reason: ReasonBadStream},
		{name: "garbage after zstd magic", data: func(testing.TB) []byte {
			return append([]byte{0x28, 0xb5, 0x2f, 0xfd}, bytes.Repeat([]byte{0xff}, 600)...)
		}, reason: ReasonBadStream},
		{name: "empty stream", data: func(testing.TB) []byte { return nil }, reason: ReasonBadStream},
		{name: "too many entries", data: taTarOf(good, tFile("b", "b"), tFile("c", "c")),
			opts: ApplyOptions{Limits: ApplyLimits{MaxEntries: 2}}, reason: ReasonTooManyEntries},
		{name: "too many bytes", data: taTarOf(tFile("a", "12345678"), tFile("b", "12345678")),
			opts: ApplyOptions{Limits: ApplyLimits{MaxBytes: 10}}, reason: ReasonTooManyBytes},
		{name: "hardlink copies count as bytes", data: taTarOf(tFile("a", "12345678"), tHardlink("b", "a")),
			opts: ApplyOptions{Limits: ApplyLimits{MaxBytes: 10}}, reason: ReasonTooManyBytes},
		{name: "file too large", data: taTarOf(tFile("a", "1234"), tFile("b", "12345")),
			opts: ApplyOptions{Limits: ApplyLimits{MaxFileBytes: 4}}, reason: ReasonFileTooLarge},
		{name: "path too long", data: taTarOf(good, tFile(strings.Repeat("d/", 20)+"f", "x")),
			opts: ApplyOptions{Limits: ApplyLimits{MaxPathBytes: 32}}, reason: ReasonPathTooLong},
		{name: "path longer than default limit", data: taTarOf(good, tFile(strings.Repeat("d/", 2100)+"f", "x")),
			reason: ReasonPathTooLong},
		{name: "name component too long", data: taTarOf(good, tFile("d/"+long, "x")), reason: ReasonPathTooLong},
		{name: "symlink target too long", data: taTarOf(tSymlink("s", strings.Repeat("t", 40))),
			opts: ApplyOptions{Limits: ApplyLimits{MaxPathBytes: 32}}, reason: ReasonPathTooLong},
		{name: "whiteout in import", data: taTarOf(good, tWhiteout("a/.wh.b")),
			opts: ApplyOptions{Mode: ApplyImport}, empty: true, reason: ReasonWhiteoutNotAllowed},
		{name: "opaque in import", data: taTarOf(good, tWhiteout("a/.wh..wh..opq")),
			opts: ApplyOptions{Mode: ApplyImport}, empty: true, reason: ReasonWhiteoutNotAllowed},
		{name: "import into non-empty dest", data: taTarOf(good),
			opts: ApplyOptions{Mode: ApplyImport}, reason: ReasonDestNotEmpty},
		{name: "aufs meta whiteout", data: taTarOf(good, tWhiteout(".wh..wh.plnk")), reason: ReasonBadWhiteout},
		{name: "empty whiteout", data: taTarOf(good, tWhiteout("a/.wh.")), reason: ReasonBadWhiteout},
		{name: "dot-dot whiteout", data: taTarOf(good, tWhiteout("a/.wh...")), reason: ReasonBadWhiteout},
		{name: "whiteout used as directory", data: taTarOf(good, tFile("a/.wh.b/c", "x")), reason: ReasonBadWhiteout},
		{name: "duplicate file", data: taTarOf(good, tFile("a", "1"), tFile("./a", "2")), reason: ReasonDuplicateEntry},
		{name: "file and directory with one name", data: taTarOf(tFile("a", "1"), tDir("a/")), reason: ReasonDuplicateEntry},
		{name: "file then entry below it", data: taTarOf(tFile("a", "1"), tFile("a/b", "2")), reason: ReasonParentNotDir},
		{name: "file replacing a directory of the stream", data: taTarOf(tFile("a/b", "1"), tFile("a", "2")),
			reason: ReasonParentNotDir},
		{name: "fifo in change layer", data: taTarOf(good, tte{name: "p", typ: tar.TypeFifo}), reason: ReasonUnsupportedEntry},
		{name: "device in change layer", data: taTarOf(good, tte{name: "null", typ: tar.TypeChar, mode: 0o666}),
			reason: ReasonUnsupportedEntry},
		{name: "file entry for the root", data: taTarOf(good, tte{name: ".", typ: tar.TypeReg}), reason: ReasonUnsupportedEntry},
		{name: "global header", data: func(t testing.TB) []byte {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader,
				PAXRecords: map[string]string{"comment": "hi"}}))
			require.NoError(t, tw.Close())
			return buf.Bytes()
		}, reason: ReasonUnsupportedEntry},
		{name: "unknown type", data: func(testing.TB) []byte {
			return append(taRawHeader("weird", 'Z', 0), make([]byte, 1024)...)
		}, reason: ReasonUnsupportedEntry},
	}
}

func TestApplyTarHostile(t *testing.T) {
	for _, tc := range taHostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dest, outside := filepath.Join(parent, "dest"), filepath.Join(parent, "outside")
			taWriteTree(t, outside, map[string]string{"target.txt": "outside"})
			require.NoError(t, os.Mkdir(dest, 0o755))
			if !tc.empty {
				taWriteTree(t, dest, map[string]string{"existing.txt": "e", "link": "->" + outside})
			}
			before, outsideBefore := taSnapshot(t, dest), taSnapshot(t, outside)

			rep, err := taApply(t, tc.data(t), dest, tc.opts)
			taRequireApplyError(t, err, PhaseValidate, tc.reason)
			require.Equal(t, ApplyReport{}, rep)
			require.Equal(t, before, taSnapshot(t, dest), "dest must be untouched")
			require.Equal(t, outsideBefore, taSnapshot(t, outside))
			require.Equal(t, []string{"dest", "outside"}, taDirNames(t, parent))
		})
	}
}

func taDirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// TestApplyPhaseRefusesDestSymlink exercises the apply-time defence: a
// symlink that appears in dest after validation is not followed.
func TestApplyPhaseRefusesDestSymlink(t *testing.T) {
	parent := t.TempDir()
	dest, outside := filepath.Join(parent, "dest"), filepath.Join(parent, "outside")
	taWriteTree(t, outside, map[string]string{"target.txt": "outside"})
	taWriteTree(t, dest, map[string]string{"link": "->" + outside, "rel": "->../outside"})
	outsideBefore := taSnapshot(t, outside)

	root, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(root)
	spool, err := newApplySpool()
	require.NoError(t, err)
	defer spool.Close()
	_, err = spool.WriteString("pwned")
	require.NoError(t, err)

	for _, name := range []string{"link/target.txt", "link/new/f", "rel/target.txt"} {
		a := newTarApplier(context.Background(), root, spool, []applyEntry{
			{name: name, kind: aeFile, perm: 0o644, mtime: taMtime, size: 5},
		})
		err := a.run()
		taRequireApplyError(t, err, PhaseApply, ReasonSymlinkInPath)
	}
	for _, e := range []applyEntry{
		{name: "link/target.txt", kind: aeWhiteout},
		{name: "link", kind: aeOpaque},
		{name: "link/d", kind: aeDir, perm: 0o755},
		{name: "link/s", kind: aeSymlink, target: "x"},
	} {
		a := newTarApplier(context.Background(), root, spool, []applyEntry{e})
		taRequireApplyError(t, a.run(), PhaseApply, ReasonSymlinkInPath)
	}
	require.Equal(t, outsideBefore, taSnapshot(t, outside))
}

func TestCleanTarName(t *testing.T) {
	tests := []struct{ in, want, reason string }{
		{"a", "a", ""},
		{"./a/b/", "a/b", ""},
		{"a//b/./c", "a/b/c", ""},
		{"./", ".", ""},
		{"", ".", ""},
		{"/a", "", ReasonAbsolutePath},
		{"../a", "", ReasonParentTraversal},
		{"a/..", "", ReasonParentTraversal},
		{"a\x00b", "", ReasonNULInName},
		{strings.Repeat("x", 256), "", ReasonPathTooLong},
		{strings.Repeat("x/", 40), "", ReasonPathTooLong},
	}
	for _, tc := range tests {
		got, reason, err := cleanTarName(tc.in, 64)
		require.Equal(t, tc.reason, reason, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
		require.Equal(t, tc.reason != "", err != nil, "%q", tc.in)
	}
}

func TestApplyErrorFormat(t *testing.T) {
	inner := errors.New("inner")
	err := error(newApplyError(PhaseValidate, "bad\x1b[31m\nname", ReasonBadStream, inner))
	require.ErrorIs(t, err, inner)
	msg := err.Error()
	require.NotContains(t, msg, "\x1b")
	require.NotContains(t, msg, "\n")
	require.Contains(t, msg, "validate: bad_stream")
	require.Contains(t, msg, `bad\x1b[31m\nname`)

	long := newApplyError(PhaseApply, strings.Repeat("y", 10000), ReasonIO, nil)
	require.Less(t, len(long.Path), 300)
}
