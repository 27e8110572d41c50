package layerstack

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestApplyEditsRefusesNonUTF8: edits are defined on text; a file that is
// not UTF-8 is refused before any replacement (the seed's rule).
func TestApplyEditsRefusesNonUTF8(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		wantErr error
	}{
		{"latin-1 byte", "caf\xe9 au lait\n", ErrNotUTF8},
		{"truncated sequence", "ok\n\xe2\x82\n", ErrNotUTF8},
		{"utf-8 text", "café au lait\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, n, err := ApplyEdits([]byte(tc.content), []Edit{{OldString: "au", NewString: "with"}})
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Nil(t, out)
				return
			}
			require.NoError(t, err)
			require.Equal(t, 1, n)
		})
	}
	s := newTestStore(t, tree{"bin.txt": "caf\xe9 au lait\n"})
	_, err := s.Amend(t.Context(), AmendRequest{TxID: "am-utf8", Path: "bin.txt", Edits: []Edit{{OldString: "au", NewString: "with"}}})
	require.ErrorIs(t, err, ErrNotUTF8)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 1, "a refused edit publishes no layer")
}
