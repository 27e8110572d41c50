package layerstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mountOverlay mounts lower (newest first) + upper at target the way a
// workspace session does, and unmounts it at cleanup.
func mountOverlay(t *testing.T, lower []string, upper, work, target string) {
	t.Helper()
	require.Equal(t, 0, os.Geteuid(), "overlay tests need root: run `make test` as root (CI does)")
	for _, d := range []string{upper, work, target} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off,index=off",
		strings.Join(lower, ":"), upper, work)
	require.NoError(t, unix.Mount("overlay", target, "overlay", 0, opts), "mount overlay")
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
}

func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "script in %s:\n%s", dir, out)
}

// sessionOps is what an agent does inside its workspace: every kind of
// change overlay can record.
const sessionOps = `
printf 'edited\n' > src/main.go
printf 'brand new\n' > src/new.go
rm src/old.go
rm -rf docs
mkdir -p docs/api && printf 'rewritten\n' > docs/api/index.md
mv tools/gen.sh tools/generate.sh
mv vendor lib
chmod +x scripts/build.sh
ln -s src/main.go main-link
rm link-to-old
ln -s src/new.go link-to-old
mkdir -p deep
i=0; while [ $i -lt 300 ]; do mkdir -p deep/d$((i % 7))/e$((i % 3)); printf "f$i\n" > deep/d$((i % 7))/e$((i % 3))/f$i.txt; i=$((i+1)); done
rm -rf empty && touch empty
`

func sessionBase() tree {
	return tree{
		"src/main.go":        "package main\n",
		"src/old.go":         "old\n",
		"docs/readme.md":     "readme\n",
		"docs/api/index.md":  "api\n",
		"docs/api/extra.md":  "extra\n",
		"tools/gen.sh*":      "#!/bin/sh\n",
		"vendor/a/b.go":      "b\n",
		"vendor/c.go":        "c\n",
		"scripts/build.sh":   "#!/bin/sh\nmake\n",
		"link-to-old":        "->src/old.go",
		"empty/":             "",
		"untouched/keep.txt": "keep\n",
		".gitignore":         "*.o\n",
	}
}

func TestOverlayMountCapturePublishRemount(t *testing.T) {
	s := newTestStore(t, sessionBase())
	l := mustLease(t, s, sess1)
	run := t.TempDir()
	ws := filepath.Join(run, "ws")
	mountOverlay(t, s.LowerDirs(l), filepath.Join(run, "upper"), filepath.Join(run, "work"), ws)
	sh(t, ws, sessionOps)

	// The same operations on a plain copy give the expected tree.
	want := t.TempDir()
	writeTree(t, want, sessionBase())
	sh(t, want, sessionOps)
	require.Equal(t, dirTree(t, want), dirTree(t, ws), "the mount itself behaves like a plain directory")
	require.NoError(t, unix.Unmount(ws, 0))

	cs, err := Capture(filepath.Join(run, "upper"))
	require.NoError(t, err)
	require.Empty(t, cs.Drops)
	r, err := s.Publish(context.Background(), PublishRequest{TxID: "overlay-1", LeaseID: l.ID, Changes: cs, Owner: sess1})
	require.NoError(t, err)
	require.False(t, r.NoOp)
	require.Equal(t, dirTree(t, want), readTree(t, s.Head()), "merged view of the new head")

	// Remount the new head with a fresh upper: byte for byte the same tree.
	l2 := mustLease(t, s, sess2)
	run2 := t.TempDir()
	ws2 := filepath.Join(run2, "ws")
	mountOverlay(t, s.LowerDirs(l2), filepath.Join(run2, "upper"), filepath.Join(run2, "work"), ws2)
	require.Equal(t, dirTree(t, want), dirTree(t, ws2))
	e, err := os.Stat(filepath.Join(ws2, "scripts/build.sh"))
	require.NoError(t, err)
	require.NotZero(t, e.Mode()&0o111, "chmod +x survives")
	requireHealthy(t, s)
}

func TestOverlayTwoSessionsMergeThroughMounts(t *testing.T) {
	base := tree{"f.txt": lines(10, func(i int) string { return fmt.Sprintf("line %d", i) })}
	s := newTestStore(t, base)
	type sess struct {
		lease *Lease
		run   string
	}
	var ss []sess
	for i, script := range []string{
		`sed -i 's/^line 2$/LINE TWO/' f.txt`,
		`sed -i 's/^line 9$/LINE NINE/' f.txt`,
	} {
		l := mustLease(t, s, fmt.Sprintf("workspace_session:m%d", i))
		run := t.TempDir()
		ws := filepath.Join(run, "ws")
		mountOverlay(t, s.LowerDirs(l), filepath.Join(run, "upper"), filepath.Join(run, "work"), ws)
		sh(t, ws, script)
		require.NoError(t, unix.Unmount(ws, 0))
		ss = append(ss, sess{l, run})
	}
	for i, x := range ss {
		cs, err := Capture(filepath.Join(x.run, "upper"))
		require.NoError(t, err)
		_, err = s.Publish(context.Background(), PublishRequest{TxID: fmt.Sprintf("m-%d", i), LeaseID: x.lease.ID, Changes: cs, Owner: x.lease.Owner})
		require.NoError(t, err)
	}
	got := headFile(t, s, "f.txt")
	require.Contains(t, got, "LINE TWO\n")
	require.Contains(t, got, "LINE NINE\n")
}
