package sandboxinit

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
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
	em := api.LayerExportMeta{LayerID: lm.ID, Kind: string(lm.Kind), TxID: lm.TxID, Owner: lm.Owner, Agent: lm.Agent,
		Message: lm.Message, Time: lm.Time.UTC().Format(time.RFC3339Nano)}
	if len(lm.Replace) > 0 {
		em.SquashedTxIDs = d.squashedTxIDs(lm.Replace)
	}
	b, _ := json.Marshal(em)
	return &layerStream{d: d, id: a.LayerID, meta: b, ctx: context.WithoutCancel(ctx)}, nil
}

// squashedTxIDs are the txids of the publishes whose layers a squash
// replaced (and of those they replaced), oldest first, from the audit log.
func (d *Daemon) squashedTxIDs(replaced []string) []string {
	hist, err := d.store.History(0)
	if err != nil {
		return nil
	}
	want := map[string]bool{}
	var add func(ids []string)
	add = func(ids []string) {
		for _, id := range ids {
			if want[id] {
				continue
			}
			want[id] = true
			if m, err := d.store.LayerMeta(id); err == nil && len(m.Replace) > 0 {
				add(m.Replace)
			}
		}
	}
	add(replaced)
	var out []string
	for _, r := range hist { // oldest first
		if want[r.LayerID] && r.TxID != "" && r.Kind != layerstack.LayerSquash {
			out = append(out, r.TxID)
		}
	}
	return out
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
