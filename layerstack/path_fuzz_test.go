package layerstack

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestCleanPath(t *testing.T) {
	ok := map[string]string{"a/b": "a/b", "/a/b": "a/b", "a//b/": "a/b", "./a/./b": "a/b", "": "", "/": "", ".wh": ".wh"}
	for in, want := range ok {
		got, err := CleanPath(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"..", "../x", "a/../../x", "a/..", "a\x00b", "\xff", strings.Repeat("a", MaxPathBytes+1), strings.Repeat("b", 256)} {
		_, err := CleanPath(bad)
		require.ErrorIs(t, err, ErrInvalidPath, "%q", bad)
	}
	for _, p := range []string{"manifest.json", "layers/x", ".layer-metadata", "a/.layer-metadata/b", "a/.wh.b", ".wh..wh..opq"} {
		require.Error(t, CheckPublishable(p), p)
	}
	for _, p := range []string{"a/manifest.json", ".wh", ".whx", "x.wh.y", "src/layers"} {
		require.NoError(t, CheckPublishable(p), p)
	}
}

// FuzzCleanPath: an accepted path is canonical, relative, free of ".."
// and NUL, idempotent, and joined under a root it stays under that root.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "/abs", "a/./b//c/", "..", "a/..", "\x00", ".wh.x", "a/b/../../..", "é/ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := CleanPath(p)
		if err != nil {
			return
		}
		if strings.HasPrefix(c, "/") || strings.Contains(c, "\x00") || !utf8.ValidString(c) {
			t.Fatalf("CleanPath(%q) = %q", p, c)
		}
		for _, comp := range strings.Split(c, "/") {
			if c != "" && (comp == ".." || comp == "." || comp == "") {
				t.Fatalf("CleanPath(%q) = %q has component %q", p, c, comp)
			}
		}
		again, err := CleanPath(c)
		if err != nil || again != c {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", p, c, again, err)
		}
		root := "/srv/ws"
		j := filepath.Join(root, c)
		if j != root && !strings.HasPrefix(j, root+"/") {
			t.Fatalf("%q escapes the root as %q", p, j)
		}
	})
}

// FuzzCaptureRoundTrip: a change set written as an upper dir (the overlay
// encoding) and captured back is the same change set.
func FuzzCaptureRoundTrip(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("\x03\x10\x22\x41\x07\x99"))
	f.Fuzz(func(t *testing.T, prog []byte) {
		want := changesFromBytes(prog)
		dir := filepath.Join(t.TempDir(), "upper")
		b, err := newBuilder(dir, plainStack())
		require.NoError(t, err)
		for _, c := range want {
			require.NoError(t, b.add(planned{ch: c}, false))
		}
		cs, err := Capture(dir)
		require.NoError(t, err)
		got := map[string]Change{}
		for _, c := range cs.Changes {
			c.Source, c.Size = "", 0
			if c.Kind == ChangeWrite {
				data, err := os.ReadFile(filepath.Join(dir, c.Path))
				require.NoError(t, err)
				c.Data = data
			}
			got[c.Path] = c
		}
		for _, c := range want {
			g, ok := got[c.Path]
			require.True(t, ok, "missing %s", c.Path)
			if c.Kind == ChangeDir && g.Kind == ChangeOpaque {
				t.Fatalf("%s captured as opaque", c.Path)
			}
			require.Equal(t, c.Kind, g.Kind, c.Path)
			if c.Kind == ChangeWrite {
				require.Equal(t, string(c.Data), string(g.Data), c.Path)
				require.Equal(t, c.Mode, g.Mode, c.Path)
			}
			if c.Kind == ChangeSymlink {
				require.Equal(t, c.Target, g.Target)
			}
			delete(got, c.Path)
		}
		for p, g := range got {
			require.Equal(t, ChangeDir, g.Kind, "only implied parent dirs may be extra: %s", p)
		}
	})
}

// changesFromBytes decodes fuzz input into a valid change set: each byte
// pair picks a kind and a path in a small namespace.
func changesFromBytes(prog []byte) []Change {
	names := []string{"a", "b", "c/d", "c/e", "f/g/h", "x.sh", "c"}
	seen := map[string]bool{}
	var out []Change
	for i := 0; i+1 < len(prog); i += 2 {
		p := names[int(prog[i])%len(names)]
		clash := seen[p]
		for q := range seen {
			if isUnder(p, q) || isUnder(q, p) {
				clash = true
			}
		}
		if clash {
			continue
		}
		seen[p] = true
		switch prog[i+1] % 5 {
		case 0:
			out = append(out, Change{Path: p, Kind: ChangeWrite, Mode: 0o644 | os.FileMode(prog[i+1]&0o100), Data: []byte(strings.Repeat("z", int(prog[i+1])))})
		case 1:
			out = append(out, Change{Path: p, Kind: ChangeDelete})
		case 2:
			out = append(out, Change{Path: p, Kind: ChangeSymlink, Target: "../t" + string(rune('a'+prog[i+1]%26))})
		case 3:
			out = append(out, Change{Path: p, Kind: ChangeDir, Mode: 0o755})
		default:
			out = append(out, Change{Path: p, Kind: ChangeOpaque, Mode: 0o750})
		}
	}
	sortChanges(out)
	return out
}

func sortChanges(cs []Change) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].Path < cs[j].Path })
}
