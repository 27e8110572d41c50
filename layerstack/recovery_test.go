package layerstack

import (
	"github.com/ephemeral-sandbox/sandbox/archive"

	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBootSweepDeletesNothingWhenManifestIsUnreadable(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	_, err := publishOn(t, s, mustLease(t, s, sess1), sess1, writes("a", "b\n"))
	require.NoError(t, err)
	root := s.Root()
	require.NoError(t, s.Close())
	// Debris a sweep would normally remove, and a torn manifest.
	require.NoError(t, os.MkdirAll(filepath.Join(root, dirStaging, "tx-leftover"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, dirLayers, "L999999-orphan"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "manifest.json"), []byte(`{"schema_version":1,"vers`), 0o644))
	before, err := os.ReadDir(filepath.Join(root, dirLayers))
	require.NoError(t, err)

	_, err = Open(root, Options{})
	require.ErrorContains(t, err, "nothing was deleted")
	after, err := os.ReadDir(filepath.Join(root, dirLayers))
	require.NoError(t, err)
	require.Equal(t, len(before), len(after))
	_, err = os.Stat(filepath.Join(root, dirStaging, "tx-leftover"))
	require.NoError(t, err, "staging is kept too")

	// A future schema is refused the same way.
	require.NoError(t, os.WriteFile(filepath.Join(root, "manifest.json"), []byte(`{"schema_version":2,"version":3,"layers":[{"layer_id":"x","path":"layers/x"}]}`), 0o644))
	_, err = Open(root, Options{})
	require.ErrorContains(t, err, "schema_version 2 is not supported")
}

func TestBootSweepRemovesDebrisWithAReadableManifest(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	root := s.Root()
	require.NoError(t, s.Close())
	require.NoError(t, os.MkdirAll(filepath.Join(root, dirStaging, "tx-leftover"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, dirLayers, "L999999-orphan"), 0o755))
	s2, err := Open(root, Options{})
	require.NoError(t, err)
	defer s2.Close()
	_, err = os.Stat(filepath.Join(root, dirLayers, "L999999-orphan"))
	require.ErrorIs(t, err, os.ErrNotExist)
	requireHealthy(t, s2)
}

func TestOpenRefusesAnOverlayRoot(t *testing.T) {
	run := t.TempDir()
	lower := filepath.Join(run, "lower")
	require.NoError(t, os.MkdirAll(lower, 0o755))
	ws := filepath.Join(run, "ws")
	mountOverlay(t, []string{lower}, filepath.Join(run, "upper"), filepath.Join(run, "work"), ws)
	_, err := Open(filepath.Join(ws, "store"), Options{})
	require.ErrorContains(t, err, "is on overlayfs")
}

func TestImportTarSkipsSpecialFilesAndRejectsEscapes(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "src/", Typeflag: tar.TypeDir, Mode: 0o755}))
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "src/main.go", Typeflag: tar.TypeReg, Mode: 0o755, Size: 3}))
	_, _ = tw.Write([]byte("go\n"))
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "pipe", Typeflag: tar.TypeFifo, Mode: 0o644}))
	require.NoError(t, tw.Close())
	parent := t.TempDir()
	info, rep, err := ImportTar(context.Background(), bytes.NewReader(buf.Bytes()), parent)
	require.NoError(t, err)
	require.Equal(t, []Drop{{Path: "pipe", Reason: DropSpecialFile}}, rep.Skipped)
	require.Equal(t, tree{"src/": "", "src/main.go*": "go\n"}, dirTree(t, info.Path))

	buf.Reset()
	tw = tar.NewWriter(&buf)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}))
	require.NoError(t, tw.Close())
	_, _, err = ImportTar(context.Background(), &buf, parent)
	var ae *archive.ApplyError
	require.True(t, errors.As(err, &ae), "%v", err)
	require.Equal(t, archive.ReasonParentTraversal, ae.Reason)
	ents, _ := os.ReadDir(parent)
	require.Len(t, ents, 2, "only the first base and its sidecar; the rejected import left nothing")
	_, err = ReadBaseInfo(parent, info.ID)
	require.NoError(t, err)
}

// TestCrashDuringSquashCommit kills a squash just before its manifest
// replace: the old manifest stays valid and the squash can run again.
func TestCrashDuringSquashCommit(t *testing.T) {
	s := newTestStore(t, historyBase(), Options{AutoSquashAt: -1})
	publishHistory(t, s)
	want := readTree(t, s.Head())
	before, _ := s.Manifest()
	root := s.Root()
	require.NoError(t, s.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestSquashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashRootEnv+"="+root, FailpointEnv+"="+FailSquashCommit)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v\n%s", err, out)
	ws := ee.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s", out)

	s2, err := Open(root, Options{AutoSquashAt: -1})
	require.NoError(t, err)
	defer s2.Close()
	after, _ := s2.Manifest()
	require.Equal(t, before.RootHash(), after.RootHash())
	require.Equal(t, want, readTree(t, s2.Head()))
	requireHealthy(t, s2)
	_, err = s2.Squash(context.Background())
	require.NoError(t, err)
	require.Equal(t, want, readTree(t, s2.Head()))
	requireHealthy(t, s2)
}

// TestSquashChild is the child side of TestCrashDuringSquashCommit.
func TestSquashChild(t *testing.T) {
	root := os.Getenv(crashRootEnv)
	if root == "" || os.Getenv(FailpointEnv) != FailSquashCommit {
		return
	}
	s, err := Open(root, Options{AutoSquashAt: -1})
	require.NoError(t, err)
	_, err = s.Squash(context.Background())
	require.NoError(t, err)
	os.Exit(0)
}
