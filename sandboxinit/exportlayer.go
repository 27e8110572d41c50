package sandboxinit

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// layerStream streams one published layer (export_layerstack with
// layer_id), for the git hand-off: one commit per publish.
type layerStream struct {
	d    *Daemon
	id   string
	meta []byte
	ctx  context.Context
}

// layerExport checks that the layer is a published layer of the head
// before anything is streamed, so an unknown one is a plain not_found.
func (d *Daemon) layerExport(ctx context.Context, a api.ExportArgs) (any, error) {
	if a.Format != "" && a.Format != "tar" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"format": a.Format}, "a single layer exports as tar only")
	}
	m, err := d.store.Manifest()
	if err != nil {
		return nil, err
	}
	found := false
	for _, l := range m.Layers[:len(m.Layers)-1] {
		found = found || l.ID == a.LayerID
	}
	if !found {
		return nil, api.Errorf(api.KindNotFound, map[string]any{"layer_id": a.LayerID, "manifest_version": m.Version},
			"layer %s is not a published layer of the head (squashed, or never published)", a.LayerID)
	}
	lm, err := d.store.LayerMeta(a.LayerID)
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(api.LayerExportMeta{LayerID: lm.ID, Kind: string(lm.Kind), TxID: lm.TxID, Owner: lm.Owner, Agent: lm.Agent,
		Message: lm.Message, Time: lm.Time.UTC().Format(time.RFC3339Nano)})
	return &layerStream{d: d, id: a.LayerID, meta: b, ctx: context.WithoutCancel(ctx)}, nil
}

func (e *layerStream) stream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Layer-Meta", base64.StdEncoding.EncodeToString(e.meta))
	w.Header().Set("Trailer", "X-Export-Error")
	w.WriteHeader(http.StatusOK)
	ctx, sp := e.d.span(e.ctx, "layerstack.export_layer", map[string]any{"layer_id": e.id})
	_, res, err := e.d.store.ExportLayer(ctx, w, e.id)
	if res != nil {
		sp.Set("bytes", res.Bytes)
	}
	sp.End(err)
	if err != nil {
		w.Header().Set("X-Export-Error", err.Error())
	}
}
