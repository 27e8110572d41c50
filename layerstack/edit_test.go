package layerstack

import (
	"math"
	"strings"
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

// TestApplyEditsBoundsTheResult: MaxEditBytes bounds what an edit leaves
// as well as what it reads. A replace_all that would grow the file past it
// is refused before anything is replaced, with the size it would have had;
// an edit landing exactly on the limit, or shrinking the file, applies.
func TestApplyEditsBoundsTheResult(t *testing.T) {
	mib := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		name    string
		content string
		edits   []Edit
		size    int64 // 0: the edits apply
		index   int
	}{
		{"replace_all grows 100x", mib, []Edit{{OldString: "a", NewString: strings.Repeat("b", 100), ReplaceAll: true}}, 100 << 20, 0},
		{"one byte over", mib, []Edit{{OldString: "a", NewString: "bbbbb", ReplaceAll: true}}, 5 << 20, 0},
		{"a later edit grows past it", mib, []Edit{{OldString: "a", NewString: "bb", ReplaceAll: true}, {OldString: "b", NewString: "ccc", ReplaceAll: true}}, 6 << 20, 1},
		{"single replacement of a huge new_string", "x", []Edit{{OldString: "x", NewString: strings.Repeat("y", MaxEditBytes+1)}}, MaxEditBytes + 1, 0},
		{"exactly the limit", mib, []Edit{{OldString: "a", NewString: "bbbb", ReplaceAll: true}}, 0, 0},
		{"shrinking", mib, []Edit{{OldString: "aa", NewString: "b", ReplaceAll: true}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := ApplyEdits([]byte(tc.content), tc.edits)
			if tc.size == 0 {
				require.NoError(t, err)
				require.LessOrEqual(t, len(out), MaxEditBytes)
				return
			}
			var tl *EditTooLargeError
			require.ErrorAs(t, err, &tl)
			require.Equal(t, &EditTooLargeError{Index: tc.index, Size: tc.size, Max: MaxEditBytes}, tl)
			require.Nil(t, out)
		})
	}
	require.Equal(t, int64(math.MaxInt64), editedSize(MaxEditBytes, MaxEditBytes, 1, math.MaxInt64/1024),
		"a size beyond int64 saturates instead of wrapping below the limit")

	// The sessionless path (file_edit without a session) publishes nothing.
	s := newTestStore(t, tree{"big.txt": mib})
	_, err := s.Amend(t.Context(), AmendRequest{TxID: "am-grow", Path: "big.txt",
		Edits: []Edit{{OldString: "a", NewString: strings.Repeat("b", 100), ReplaceAll: true}}})
	var tl *EditTooLargeError
	require.ErrorAs(t, err, &tl)
	m, _ := s.Manifest()
	require.Len(t, m.Layers, 1, "a refused edit publishes no layer")
	b, _, err := s.Head().ReadFile("big.txt", 0)
	require.NoError(t, err)
	require.Equal(t, mib, string(b))
}
