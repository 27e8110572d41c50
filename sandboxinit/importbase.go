package sandboxinit

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/archive"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/telemetry"
)

// serveImportBase imports the base from the workspace tar in the request
// body (api.ImportBasePath): the worker streams the host tree here once,
// and the layer store writes, hashes and syncs it in one pass. The tar is
// checked entry by entry (layerstack.ImportStream); a refused stream is
// invalid_request with its reason and path, and leaves nothing.
func (s *Server) serveImportBase(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, api.Errorf(api.KindMethodNotAllowed, nil, "use POST"))
		return
	}
	all := false
	switch v := r.URL.Query().Get("all"); v {
	case "", "false":
	case "true":
		all = true
	default:
		writeError(w, api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "all"}, "all must be true or false, not %q", v))
		return
	}
	defer s.d.inflight.begin("import_base")()
	s.d.touch()
	rid := r.Header.Get("X-Request-Id")
	ctx, sp := s.d.span(telemetry.WithTrace(r.Context(), rid), "daemon.dispatch", map[string]any{"op": "import_base"})
	// Read in large pieces: the tar reader asks for a block at a time.
	res, err := s.importBase(ctx, bufio.NewReaderSize(r.Body, 256<<10), all)
	if err != nil {
		sp.Set("error_kind", api.AsError(err).Kind)
	}
	sp.End(err)
	if err != nil {
		s.d.log.Debug("operation failed", "op", "import_base", "request_id", rid, "err", err)
		writeError(w, s.red.redact(err))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) importBase(ctx context.Context, body io.Reader, all bool) (*api.InitBaseResult, error) {
	s.importMu.Lock()
	defer s.importMu.Unlock()
	d := s.d
	if m, err := d.store.Manifest(); err == nil {
		// A retried stream whose first attempt committed: the same answer.
		return &api.InitBaseResult{BaseID: m.Base().ID, Revision: revisionJSON(m.Revision()), AlreadyInitialized: true}, nil
	}
	parent := filepath.Join(d.store.Root(), "base")
	clearStaleImports(parent)
	ctx, sp := d.span(ctx, "layerstack.import", map[string]any{"streamed": true})
	info, rep, err := layerstack.ImportStream(ctx, body, parent, layerstack.StreamImportOptions{All: all})
	if rep != nil {
		sp.Set("files", rep.Files)
		sp.Set("bytes", rep.Bytes)
	}
	sp.End(err)
	if err != nil {
		var ae *archive.ApplyError
		if errors.As(err, &ae) && ae.Phase == archive.PhaseValidate && ae.Reason != archive.ReasonCanceled && ae.Reason != archive.ReasonIO {
			return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"reason": ae.Reason, "path": ae.Path},
				"workspace import refused (%s at %q): nothing was imported", ae.Reason, ae.Path)
		}
		return nil, api.Errorf(api.KindOperationFailed, nil, "import base: %v", err)
	}
	m, err := d.initStore(ctx, info)
	if err != nil {
		return nil, err
	}
	return &api.InitBaseResult{BaseID: info.ID, RootHash: info.RootHash, Revision: revisionJSON(m.Revision()), Import: rep}, nil
}

// clearStaleImports removes what an import cut short by a daemon crash
// left in the base directory (one import runs at a time, under importMu).
func clearStaleImports(parent string) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".import-") {
			_ = os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
}
