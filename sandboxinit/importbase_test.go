package sandboxinit

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/command"
)

// newBarrenDaemon is a daemon whose store has no base yet (a new sandbox).
func newBarrenDaemon(t *testing.T) *Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (the layer store probes overlay mounts): run it as root, as make test does")
	}
	dir := t.TempDir()
	cfg := Config{StateDir: dir, SandboxID: "eos-test", Logger: slog.New(slog.DiscardHandler)}
	cfg.defaults()
	store, err := layerstack.Open(filepath.Join(dir, "layerstack"), layerstack.Options{Logger: cfg.Logger})
	require.NoError(t, err)
	d := &Daemon{cfg: cfg, log: cfg.Logger, tokenSum: sha256.Sum256([]byte(testToken)), store: store, cmds: command.New(command.Options{}),
		sessions: map[string]*session{}, started: time.Now()}
	require.NoError(t, d.openObservability())
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

func postImport(t *testing.T, h http.Handler, token, query string, body []byte) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:7001"+api.ImportBasePath+query, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
	return rec.Code, out
}

func tarFiles(t *testing.T, files ...string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: files[i], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[i+1]))}))
		_, err := tw.Write([]byte(files[i+1]))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

// The streamed import over the daemon's HTTP door: a hostile tar is refused
// with its reason and leaves no base; a good one becomes the base (bigger
// than the RPC body cap); a repeat answers the same base; no token, no import.
func TestImportBaseRoute(t *testing.T) {
	d := newBarrenDaemon(t)
	h := NewServer(d).http.Handler

	code, out := postImport(t, h, "wrong", "", tarFiles(t, "a.txt", "a"))
	require.Equal(t, http.StatusUnauthorized, code, out)

	code, out = postImport(t, h, testToken, "", tarFiles(t, "ok.txt", "x", "../../escape", "x"))
	require.Equal(t, http.StatusBadRequest, code, out)
	e := out["error"].(map[string]any)
	require.Equal(t, string(api.KindInvalidRequest), e["kind"], out)
	require.Equal(t, "parent_traversal", e["details"].(map[string]any)["reason"], out)
	_, err := d.store.Manifest()
	require.Error(t, err, "no base after a refused stream")
	ents, err := os.ReadDir(filepath.Join(d.store.Root(), "base"))
	require.NoError(t, err)
	require.Empty(t, ents, "nothing left of the refused stream")

	code, out = postImport(t, h, testToken, "?all=maybe", tarFiles(t, "a.txt", "a"))
	require.Equal(t, http.StatusBadRequest, code, out)

	big := string(bytes.Repeat([]byte("0123456789abcdef"), (int(d.cfg.MaxRequestBytes)/16)+1000))
	code, out = postImport(t, h, testToken, "?all=true", tarFiles(t, "a.txt", "a\n", "dir/big.bin", big))
	require.Equal(t, http.StatusOK, code, out)
	baseID := out["base_id"].(string)
	require.NotEmpty(t, baseID)
	require.Equal(t, float64(2), out["import"].(map[string]any)["files"], out)
	m, err := d.store.Manifest()
	require.NoError(t, err)
	require.Equal(t, baseID, m.Base().ID)
	b, err := os.ReadFile(filepath.Join(d.store.Root(), "base", baseID, "dir", "big.bin"))
	require.NoError(t, err)
	require.Equal(t, big, string(b))

	code, out = postImport(t, h, testToken, "", tarFiles(t, "other.txt", "o"))
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, baseID, out["base_id"])
	require.Equal(t, true, out["already_initialized"])
}
