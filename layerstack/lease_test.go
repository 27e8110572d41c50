package layerstack

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// AcquireWith persists the lease and the caller's record of it together;
// a record that cannot be written leaves no lease, on disk or held.
func TestAcquireWith(t *testing.T) {
	s := newTestStore(t, tree{"a": "a\n"})
	dir := t.TempDir()
	rec := filepath.Join(dir, "session.json")
	l, err := s.AcquireWith(sess1, func(l *Lease) (*atomicfile.File, error) {
		b, err := json.Marshal(map[string]string{"lease_id": l.ID})
		return &atomicfile.File{Name: rec, Data: b, Perm: 0o600}, err
	})
	require.NoError(t, err)
	var got map[string]string
	b, err := os.ReadFile(rec)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, l.ID, got["lease_id"], "the record names the lease it was written with")
	_, err = os.Stat(s.leasePath(l.ID))
	require.NoError(t, err)
	held, err := s.Lease(l.ID)
	require.NoError(t, err)
	require.Equal(t, sess1, held.Owner)

	l2, err := s.AcquireWith(sess2, func(*Lease) (*atomicfile.File, error) { return nil, nil })
	require.NoError(t, err, "no record: a plain acquire")
	_, err = s.Lease(l2.ID)
	require.NoError(t, err)

	before := len(s.Leases())
	boom := errors.New("boom")
	_, err = s.AcquireWith(sess1, func(*Lease) (*atomicfile.File, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	_, err = s.AcquireWith(sess1, func(*Lease) (*atomicfile.File, error) {
		return &atomicfile.File{Name: filepath.Join(dir, "missing", "session.json"), Data: []byte("x"), Perm: 0o600}, nil
	})
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Len(t, s.Leases(), before, "no lease held")
	ents, err := os.ReadDir(filepath.Join(s.Root(), dirLeases))
	require.NoError(t, err)
	require.Len(t, ents, before, "no lease file left: %v", ents)
	requireHealthy(t, s)
}
