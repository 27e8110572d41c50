package layerstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// tree describes a directory for tests: "dir/" is a directory, a value
// starting with "->" is a symlink target, a key ending in "*" is an
// executable file (the "*" is not part of the name).
type tree map[string]string

// mkdirs makes path and its missing parents, each 0755 whatever the umask.
func mkdirs(t testing.TB, path string) {
	t.Helper()
	path = filepath.Clean(path)
	if _, err := os.Lstat(path); err == nil {
		return
	}
	mkdirs(t, filepath.Dir(path))
	require.NoError(t, os.Mkdir(path, 0o755))
	require.NoError(t, os.Chmod(path, 0o755))
}

// Every directory it makes is 0755 and every file 0644 (0755 with "*"),
// whatever the umask: tests compare the modes a capture or a copy keeps.
func writeTree(t testing.TB, dir string, tr tree) {
	t.Helper()
	keys := make([]string, 0, len(tr))
	for k := range tr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := tr[k]
		name, exec := strings.CutSuffix(k, "*")
		full := filepath.Join(dir, name)
		mkdirs(t, filepath.Dir(full))
		switch {
		case strings.HasSuffix(name, "/"):
			mkdirs(t, full)
		case strings.HasPrefix(v, "->"):
			require.NoError(t, os.Symlink(v[2:], full))
		default:
			mode := os.FileMode(0o644)
			if exec {
				mode = 0o755
			}
			require.NoError(t, os.WriteFile(full, []byte(v), mode))
			require.NoError(t, os.Chmod(full, mode))
		}
	}
}

// readTree renders a merged view as a tree (executables marked with "*").
func readTree(t testing.TB, v *View) tree {
	t.Helper()
	out := tree{}
	require.NoError(t, v.Walk("", func(e Entry) error {
		switch e.Kind {
		case KindDirectory:
			out[e.Path+"/"] = ""
		case KindSymlink:
			out[e.Path] = "->" + e.Target
		default:
			b, _, err := v.ReadFile(e.Path, 0)
			if err != nil {
				return err
			}
			k := e.Path
			if e.Mode&0o111 != 0 {
				k += "*"
			}
			out[k] = string(b)
		}
		return nil
	}))
	return out
}

// dirTree renders a plain directory the same way.
func dirTree(t testing.TB, dir string) tree {
	t.Helper()
	return readTree(t, NewView(dir))
}

// newTestStore imports base as the base of a fresh store.
func newTestStore(t testing.TB, base tree, opts ...Options) *Store {
	t.Helper()
	src := t.TempDir()
	writeTree(t, src, base)
	root := t.TempDir()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	s, err := Open(root, o)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	info, _, err := ImportDir(context.Background(), src, filepath.Join(root, dirBase), ImportOptions{All: true})
	require.NoError(t, err)
	_, err = s.Init(context.Background(), info)
	require.NoError(t, err)
	return s
}

// writes builds a change set of in-memory writes.
func writes(kv ...string) *ChangeSet {
	cs := &ChangeSet{}
	for i := 0; i+1 < len(kv); i += 2 {
		cs.Changes = append(cs.Changes, Change{Path: kv[i], Kind: ChangeWrite, Mode: 0o644, Data: []byte(kv[i+1])})
	}
	return cs
}

var txSeq int

func nextTx() string {
	txSeq++
	return fmt.Sprintf("tx-%d", txSeq)
}

// publish leases the head, then publishes cs made on that lease.
func publishOn(t testing.TB, s *Store, lease *Lease, owner string, cs *ChangeSet) (*PublishResult, error) {
	t.Helper()
	return s.Publish(context.Background(), PublishRequest{TxID: nextTx(), LeaseID: lease.ID, Changes: cs, Owner: owner})
}

func mustLease(t testing.TB, s *Store, owner string) *Lease {
	t.Helper()
	l, err := s.Acquire(owner)
	require.NoError(t, err)
	return l
}

func headFile(t testing.TB, s *Store, p string) string {
	t.Helper()
	b, _, err := s.Head().ReadFile(p, 0)
	require.NoError(t, err)
	return string(b)
}

func requireHealthy(t testing.TB, s *Store) {
	t.Helper()
	problems, err := s.Verify(context.Background())
	require.NoError(t, err)
	require.Empty(t, problems)
}

func lines(n int, f func(i int) string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(f(i))
		b.WriteByte('\n')
	}
	return b.String()
}
