package layerstack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExportLayerIsOnePublish: each layer exports only what its publish
// changed (a later publish's writes and deletes are not in an earlier
// layer's stream), with the publish's metadata; the base and unknown
// layers are refused.
func TestExportLayerIsOnePublish(t *testing.T) {
	s := newTestStore(t, tree{"a.txt": "a\n", "keep.txt": "k\n", "gone.txt": "g\n"})
	r1, err := publishOn(t, s, mustLease(t, s, "workspace_session:ws-1"), "workspace_session:ws-1", writes("a.txt", "a1\n", "new/b.bin", "\x00\xff"))
	require.NoError(t, err)
	cs := writes("a.txt", "a2\n")
	cs.Changes = append(cs.Changes, Change{Path: "gone.txt", Kind: ChangeDelete})
	r2, err := publishOn(t, s, mustLease(t, s, "workspace_session:ws-2"), "workspace_session:ws-2", cs)
	require.NoError(t, err)

	read := func(id string) (map[string]string, *LayerMeta) {
		var buf bytes.Buffer
		meta, res, err := s.ExportLayer(context.Background(), &buf, id)
		require.NoError(t, err)
		require.Equal(t, []string{id}, res.LayersExported)
		out := map[string]string{}
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			b, _ := io.ReadAll(tr)
			if h.Typeflag != tar.TypeDir {
				out[h.Name] = string(b)
			}
		}
		return out, meta
	}
	l1, m1 := read(r1.LayerID)
	require.Equal(t, map[string]string{"a.txt": "a1\n", "new/b.bin": "\x00\xff"}, l1)
	require.Equal(t, "workspace_session:ws-1", m1.Owner)
	require.Equal(t, r1.TxID, m1.TxID)
	l2, m2 := read(r2.LayerID)
	require.Equal(t, map[string]string{"a.txt": "a2\n", ".wh.gone.txt": ""}, l2)
	require.Equal(t, "workspace_session:ws-2", m2.Owner)

	m, err := s.Manifest()
	require.NoError(t, err)
	_, _, err = s.ExportLayer(context.Background(), io.Discard, m.Base().ID)
	require.True(t, errors.Is(err, ErrUnknownLayer), "%v", err)
	_, _, err = s.ExportLayer(context.Background(), io.Discard, "no-such-layer")
	require.True(t, errors.Is(err, ErrUnknownLayer), "%v", err)
}
