package layerstack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
)

// ErrUnknownLayer: the layer is not in the head's stack (never published,
// or squashed into another since).
var ErrUnknownLayer = errors.New("layer is not in the head's stack")

// ExportLayer streams one layer of the head — what that publish changed
// over the layers below it — to w as an OCI layer tar (.wh. whiteouts,
// .wh..wh..opq markers), and returns its metadata. The base cannot be
// exported this way. The export holds a lease on the head it reads.
func (s *Store) ExportLayer(ctx context.Context, w io.Writer, layerID string) (*LayerMeta, *ExportResult, error) {
	if err := s.check(); err != nil {
		return nil, nil, err
	}
	lease, err := s.Acquire("export")
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = s.Release(lease.ID) }()
	at := -1
	for i, l := range lease.Layers[:len(lease.Layers)-1] {
		if l.ID == layerID {
			at = i
		}
	}
	if at < 0 {
		return nil, nil, fmt.Errorf("%w: %s", ErrUnknownLayer, layerID)
	}
	meta, err := s.meta(layerID)
	if err != nil {
		return nil, nil, err
	}
	res := &ExportResult{ManifestVersion: lease.ManifestVersion, Format: ExportTar, LayersExported: []string{layerID}}
	dirs := s.stackOf(lease.Layers)
	cw := &countingWriter{w: w}
	tw := tar.NewWriter(cw)
	f := &folder{ctx: ctx, run: dirs.slice(at, at+1), below: dirs.slice(at+1, dirs.len()), sink: &tarSink{tw: tw, res: res}}
	if err := f.fold(); err != nil {
		return nil, nil, fmt.Errorf("export layer %s: %w", layerID, err)
	}
	if err := tw.Close(); err != nil {
		return nil, nil, err
	}
	res.Bytes = cw.n
	return meta, res, nil
}
