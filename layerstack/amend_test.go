package layerstack

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAmendIdenticalRewrite: a sessionless write identical to the head's
// file is a no-op only when that file is in the newest layer; below it, the
// write commits a layer and every line keeps its first owner (the seed's
// rule).
func TestAmendIdenticalRewrite(t *testing.T) {
	s := newTestStore(t, tree{"base.txt": "b\n"})
	write := func(txid, p, content, owner string) *AmendResult {
		t.Helper()
		r, err := s.Amend(t.Context(), AmendRequest{TxID: txid, Path: p, Content: []byte(content), Owner: owner})
		require.NoError(t, err)
		return r
	}
	write("a1", "a.txt", "alpha\nbeta", "operation:A")
	require.True(t, write("a2", "a.txt", "alpha\nbeta", "operation:B").NoOp, "a repeat at the head")
	write("b1", "b.txt", "other", "operation:C")
	r := write("a3", "a.txt", "alpha\nbeta", "operation:D")
	require.False(t, r.NoOp, "the head's a.txt is below the newest layer")
	require.False(t, r.Created)
	m, err := s.Manifest()
	require.NoError(t, err)
	require.Len(t, m.Layers, 4)
	b, err := s.Blame("a.txt")
	require.NoError(t, err)
	require.Equal(t, []BlameRange{{Start: 1, Count: 2, Owner: "operation:A"}}, b)
}

// TestBlameAuditRecords: blame answers from the layers' records, as the
// seed: nothing for a base file never touched or a directory, the last
// record of a deleted file, and one wholesale range for a file written on
// the gitignored route.
func TestBlameAuditRecords(t *testing.T) {
	s := newTestStore(t, tree{"base.txt": "b\n", ".gitignore": "logs/\n", "src/keep.txt": "k\n"})
	var na *NoAuditError
	for _, p := range []string{"base.txt", "src", "missing.txt"} {
		_, err := s.Blame(p)
		require.ErrorAs(t, err, &na, p)
		require.Equal(t, "no auditability record for path: "+p, err.Error())
	}

	_, err := s.Amend(t.Context(), AmendRequest{TxID: "v", Path: "gone.txt", Content: []byte("zero\n"), Owner: "operation:V"})
	require.NoError(t, err)
	_, err = s.Amend(t.Context(), AmendRequest{TxID: "w", Path: "gone.txt", Content: []byte("one\ntwo\n"), Owner: "operation:W"})
	require.NoError(t, err)
	_, err = s.CommitOnHead(t.Context(), PublishRequest{TxID: "d", Owner: "operation:D", Changes: &ChangeSet{Changes: []Change{{Path: "gone.txt", Kind: ChangeDelete}}}})
	require.NoError(t, err)
	b, err := s.Blame("gone.txt")
	require.NoError(t, err, "a deleted file keeps its last record")
	require.Equal(t, []BlameRange{{Start: 1, Count: 2, Owner: "operation:W"}}, b)

	l := mustLease(t, s, sess1)
	_, err = publishOn(t, s, l, sess1, writes("logs/app.log", "a\nb\nc"))
	require.NoError(t, err)
	b, err = s.Blame("logs/app.log")
	require.NoError(t, err)
	require.Equal(t, []BlameRange{{Start: 1, Count: 1, Owner: sess1}}, b, "gitignored: wholesale")
}
