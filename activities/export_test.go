package activities

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// layerTar is a small change layer: a file, a symlink, a whiteout and an
// opaque directory.
func layerTar(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []struct {
		name, body, link string
		typ              byte
	}{
		{name: "dir/", typ: tar.TypeDir},
		{name: "dir/new.txt", body: "new\n", typ: tar.TypeReg},
		{name: "link", link: "dir/new.txt", typ: tar.TypeSymlink},
		{name: ".wh.gone.txt", typ: tar.TypeReg},
		{name: "opq/", typ: tar.TypeDir},
		{name: "opq/.wh..wh..opq", typ: tar.TypeReg},
	} {
		mode := int64(0o644)
		if h.typ == tar.TypeDir {
			mode = 0o755
		}
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: h.name, Typeflag: h.typ, Linkname: h.link, Mode: mode, Size: int64(len(h.body))}))
		_, err := tw.Write([]byte(h.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

// exportFixture is a fake daemon serving export_layerstack and a fake Docker
// holding the store's manifest.
type exportFixture struct {
	acts     *Activities
	ep       api.Endpoint
	version  atomic.Int64 // manifest version served by Docker
	bumpOnce atomic.Int64 // bump the version during this many exports
	exports  atomic.Int64
	failWith string // X-Export-Error trailer
	daemon   *fakeDaemon
	onExport func() // called as an export starts streaming
}

func newExportFixture(t *testing.T) *exportFixture {
	t.Helper()
	fx := &exportFixture{}
	fx.version.Store(3)
	d := newFakeDocker()
	fx.acts = newTestActivities(t, d)
	_, err := fx.acts.CreateContainer(context.Background(), testSpec("sbx1"))
	require.NoError(t, err)
	d.files[manifestPath] = func() []byte {
		v := fx.version.Load()
		return fmt.Appendf(nil, `{"schema_version":1,"version":%d,"layers":[{"layer_id":"L%d","path":"layers/L%d"},{"layer_id":"L1","path":"layers/L1"},{"layer_id":"B1","path":"base"}]}`, v, v, v)
	}
	layer := layerTar(t)
	fd := newFakeDaemon(t, "sbx1", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/rpc/list_workspace_sessions" {
			_, _ = w.Write([]byte(`{"workspace_sessions":[{"workspace_session_id":"ws-a"},{"workspace_session_id":"ws-b"}],"archived_sessions":[]}`))
			return
		}
		require.Equal(t, "/rpc/export_layerstack", r.URL.Path)
		fx.exports.Add(1)
		if fx.onExport != nil {
			fx.onExport()
		}
		var args struct{ Format string }
		require.NoError(t, json.Unmarshal(*fx.daemon.body.Load(), &args))
		body := layer
		switch args.Format {
		case "tar-zst":
			zw, _ := zstd.NewWriter(nil)
			body = zw.EncodeAll(layer, nil)
		case "patch":
			body = []byte("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\ndiff --git a/y b/y\n")
		}
		w.Header().Set("Trailer", "X-Export-Error")
		w.WriteHeader(http.StatusOK)
		if fx.failWith != "" {
			_, _ = w.Write(body[:700])
			w.Header().Set("X-Export-Error", fx.failWith)
			return
		}
		_, _ = w.Write(body)
		if fx.bumpOnce.Load() > 0 {
			fx.bumpOnce.Add(-1)
			fx.version.Add(1) // a publish lands while the export streams
		}
	})
	fx.daemon, fx.ep = fd, fd.endpoint(t)
	return fx
}

func TestExportDir(t *testing.T) {
	fx := newExportFixture(t)
	dest := filepath.Join(t.TempDir(), "out")
	require.NoError(t, os.MkdirAll(filepath.Join(dest, "opq"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dest, "gone.txt"), []byte("old"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dest, "opq", "stale"), []byte("old"), 0o644))

	res, err := fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest})
	require.NoError(t, err)
	require.Equal(t, &api.ExportResult{
		ManifestVersion: 3, Format: "dir", LayersExported: []string{"L3", "L1"},
		FilesWritten: ptr(1), SymlinksWritten: ptr(1), DeletesApplied: ptr(1), OpaqueClears: ptr(1),
		SkippedUnchanged: ptr(0), BytesWritten: 4, LiveWorkspaceSessions: []string{"ws-a", "ws-b"},
	}, res)
	b, err := os.ReadFile(filepath.Join(dest, "dir", "new.txt"))
	require.NoError(t, err)
	require.Equal(t, "new\n", string(b))
	target, err := os.Readlink(filepath.Join(dest, "link"))
	require.NoError(t, err)
	require.Equal(t, "dir/new.txt", target)
	require.NoFileExists(t, filepath.Join(dest, "gone.txt"))
	require.NoFileExists(t, filepath.Join(dest, "opq", "stale"))

	// Again: everything is already there.
	res, err = fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest, Format: "dir"})
	require.NoError(t, err)
	require.Equal(t, 1, *res.SkippedUnchanged)
	require.Equal(t, 0, *res.FilesWritten, "an unchanged head writes no content again")
	require.Equal(t, int64(0), res.BytesWritten)
}

func TestExportRedoneWhenTheStackMoves(t *testing.T) {
	fx := newExportFixture(t)
	fx.bumpOnce.Store(1)
	dest := filepath.Join(t.TempDir(), "out")
	res, err := fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest})
	require.NoError(t, err)
	require.EqualValues(t, 2, fx.exports.Load())
	require.Equal(t, int64(4), res.ManifestVersion)
	require.Equal(t, []string{"L4", "L1"}, res.LayersExported)

	fx.bumpOnce.Store(10)
	_, err = fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: filepath.Join(t.TempDir(), "x.tar"), Format: "tar"})
	require.ErrorIs(t, err, errStackMoved)
	require.True(t, retryable(err))
}

func TestExportDaemonFailureMidStream(t *testing.T) {
	fx := newExportFixture(t)
	fx.failWith = "disk on fire"
	dest := filepath.Join(t.TempDir(), "out")
	_, err := fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest})
	require.ErrorContains(t, err, "disk on fire")
	require.NoDirExists(t, dest, "nothing applied")

	file := filepath.Join(t.TempDir(), "x.tar")
	_, err = fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: file, Format: "tar"})
	require.ErrorContains(t, err, "disk on fire")
	require.NoFileExists(t, file)
	entries, _ := os.ReadDir(filepath.Dir(file))
	require.Empty(t, entries, "no temp file left behind")
}

func TestExportArchives(t *testing.T) {
	fx := newExportFixture(t)
	dir := t.TempDir()
	for _, format := range []string{"tar", "tar-zst"} {
		dest := filepath.Join(dir, "changes."+format)
		res, err := fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest, Format: format})
		require.NoError(t, err)
		fi, err := os.Stat(dest)
		require.NoError(t, err)
		require.Equal(t, &api.ExportResult{
			ManifestVersion: 3, Format: format, LayersExported: []string{"L3", "L1"},
			FilesWritten: ptr(1), SymlinksWritten: ptr(1), WhiteoutsEmitted: ptr(2), BytesWritten: fi.Size(),
		}, res)
		require.EqualValues(t, 0o644, fi.Mode().Perm())

		_, err = fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest, Format: format})
		requireAppError(t, err, api.KindInvalidRequest, true)
	}
	dest := filepath.Join(dir, "changes.patch")
	res, err := fx.acts.ExportChanges(context.Background(), workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: dest, Format: "patch"})
	require.NoError(t, err)
	require.Equal(t, 2, *res.FilesChanged)
	b, err := os.ReadFile(dest)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(b), "diff --git a/x b/x\n"))
}

func TestExportRejectsBadSpecs(t *testing.T) {
	fx := newExportFixture(t)
	ctx := context.Background()
	_, err := fx.acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: "relative/out"})
	requireAppError(t, err, api.KindInvalidRequest, true)
	_, err = fx.acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: "sbx1", Daemon: fx.ep, Dest: "/tmp/x", Format: "zip"})
	requireAppError(t, err, api.KindInvalidRequest, true)
	_, err = fx.acts.ExportChanges(ctx, workflows.ExportSpec{SandboxID: "nosuch", Daemon: fx.ep, Dest: filepath.Join(t.TempDir(), "o")})
	requireAppError(t, err, api.KindNotFound, true)
}

func ptr[T any](v T) *T { return &v }
