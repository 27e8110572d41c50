package layerstack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// replayBase is the tree the concurrent publishers start from: files of
// several lines (a merge needs one), in nested directories, an ignore file.
func replayBase() tree {
	body := func(name string) string {
		return lines(6, func(i int) string { return fmt.Sprintf("%s line %d", name, i) })
	}
	return tree{
		"top.txt": body("top"), ".gitignore": "*.log\n",
		"a/1.txt": body("a1"), "a/2.txt": body("a2"), "a/3.txt": body("a3"),
		"b/1.txt": body("b1"), "b/2.txt": body("b2"),
		"c/d/1.txt": body("cd1"), "c/d/2.txt": body("cd2"), "c/e/1.txt": body("ce1"),
	}
}

// randomChanges is 1-3 changes a session made on top of what it sees: an
// edit of one line of a file (two sessions editing different lines of one
// file merge), a new file (in a new directory too, listed as a capture
// lists it), a delete of a file or a directory, a directory's mode, a
// symlink, an ignored file. No path of the set is below another.
func randomChanges(rng *rand.Rand, seen tree, who string, n int) *ChangeSet {
	var files, dirs []string
	for k := range seen {
		switch {
		case strings.HasSuffix(k, "/"):
			dirs = append(dirs, strings.TrimSuffix(k, "/"))
		case !strings.HasPrefix(seen[k], "->"):
			files = append(files, strings.TrimSuffix(k, "*"))
		}
	}
	sort.Strings(files)
	sort.Strings(dirs)
	cs := &ChangeSet{}
	var taken []string
	free := func(p string) bool {
		for _, q := range taken {
			if p == q || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") {
				return false
			}
		}
		return true
	}
	add := func(chs ...Change) {
		for _, ch := range chs {
			taken = append(taken, ch.Path)
		}
		cs.Changes = append(cs.Changes, chs...)
	}
	tag := fmt.Sprintf("%s-%d", who, n)
	for range 1 + rng.Intn(3) {
		switch op := rng.Intn(10); {
		case op < 5 && len(files) > 0: // edit one line
			p := files[rng.Intn(len(files))]
			if !free(p) {
				continue
			}
			ls := strings.SplitAfter(seen[p], "\n")
			if i := rng.Intn(len(ls)); ls[i] != "" {
				ls[i] = "edited by " + tag + "\n"
			} else {
				ls[i] = "appended by " + tag + "\n"
			}
			add(Change{Path: p, Kind: ChangeWrite, Mode: 0o644, Data: []byte(strings.Join(ls, ""))})
		case op < 7: // a new file, in a new directory one time in three
			parent := ""
			if len(dirs) > 0 {
				parent = dirs[rng.Intn(len(dirs))] + "/"
			}
			if rng.Intn(3) == 0 {
				nd := parent + "n" + tag
				if !free(nd) {
					continue
				}
				add(Change{Path: nd, Kind: ChangeDir, Mode: 0o755},
					Change{Path: nd + "/new.txt", Kind: ChangeWrite, Mode: 0o644, Data: []byte("new in " + tag + "\n")})
				continue
			}
			if p := parent + "f" + tag + ".txt"; free(p) {
				add(Change{Path: p, Kind: ChangeWrite, Mode: 0o644, Data: []byte("file of " + tag + "\n")})
			}
		case op == 7 && len(files)+len(dirs) > 0: // a delete
			all := append(append([]string(nil), files...), dirs...)
			if p := all[rng.Intn(len(all))]; free(p) {
				add(Change{Path: p, Kind: ChangeDelete})
			}
		case op == 8 && len(dirs) > 0: // a directory's mode
			if p := dirs[rng.Intn(len(dirs))]; free(p) {
				add(Change{Path: p, Kind: ChangeDir, Mode: fs.FileMode([]int{0o700, 0o750, 0o755}[rng.Intn(3)])})
			}
		default: // a symlink, or a file the base ignores
			if rng.Intn(2) == 0 {
				if p := "l" + tag; free(p) {
					add(Change{Path: p, Kind: ChangeSymlink, Target: "top.txt"})
				}
			} else if p := "x" + tag + ".log"; free(p) {
				add(Change{Path: p, Kind: ChangeWrite, Mode: 0o644, Data: []byte("ignored\n")})
			}
		}
	}
	return cs
}

// replayed is one publish of the concurrent run that committed a layer.
type replayed struct {
	owner       string
	txid        string
	baseVersion int64 // the manifest version its lease pinned
	version     int64 // the one it committed
	changes     *ChangeSet
	onHead      bool // CommitOnHead, not Publish
}

// Many sessions publish at once, each on the head it leased, while others
// commit under their builds: some commit the layer they built on a head
// that moved (untouchedSince), others build again, others conflict. Then
// every committed publish is replayed one at a time on a fresh store of the
// same base, in commit order, each on a lease of the version its original
// lease pinned, where no head ever moves under a build. Each version must
// hold the same layer (digest, path outcomes, line owners) and the head the
// same tree: a layer committed on a moved head is the one a build on that
// head would have made. Sessionless file ops (CommitOnHead) commit among
// them.
func TestConcurrentPublishesMatchASerialReplay(t *testing.T) {
	const workers, each = 6, 14
	seed := time.Now().UnixNano()
	if v := os.Getenv("LAYERSTACK_REPLAY_SEED"); v != "" { // to run a failure's choices again
		var err error
		seed, err = strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (LAYERSTACK_REPLAY_SEED)", seed)
	s := newTestStore(t, replayBase())
	var hookMu sync.Mutex
	hookRng := rand.New(rand.NewSource(seed))
	s.afterBuild = func() { // a window in which others commit
		hookMu.Lock()
		d := time.Duration(hookRng.Intn(1500)) * time.Microsecond
		hookMu.Unlock()
		time.Sleep(d)
	}
	var (
		mu        sync.Mutex
		done      []replayed
		conflicts int
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w) + 1))
			owner := fmt.Sprintf("workspace_session:w%d", w)
			for n := range each {
				l, err := s.Acquire(owner)
				if !assertNoErr(t, err) {
					return
				}
				v, err := s.View(l.ID)
				if !assertNoErr(t, err) {
					return
				}
				cs := randomChanges(rng, readTree(t, v), fmt.Sprintf("w%d", w), n)
				time.Sleep(time.Duration(rng.Intn(2000)) * time.Microsecond)
				txid := fmt.Sprintf("replay-w%d-%d", w, n)
				req := PublishRequest{TxID: txid, LeaseID: l.ID, Changes: cs, Owner: owner}
				onHead := w == 0 && n%2 == 1 // a sessionless file op: on the head, whatever the lease saw
				var res *PublishResult
				if onHead {
					req.LeaseID, req.Owner = "", "operation:"+txid
					res, err = s.CommitOnHead(context.Background(), req)
				} else {
					res, err = s.Publish(context.Background(), req)
				}
				var ce *ConflictError
				switch {
				case errors.As(err, &ce):
					mu.Lock()
					conflicts++
					mu.Unlock()
				case !assertNoErr(t, err):
					return
				case !res.NoOp:
					mu.Lock()
					done = append(done, replayed{owner: req.Owner, txid: txid, baseVersion: l.ManifestVersion, version: res.Revision.ManifestVersion, changes: cs, onHead: onHead})
					mu.Unlock()
				}
				assertNoErr(t, s.Release(l.ID))
			}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	requireHealthy(t, s)
	t.Logf("%d committed, %d on a moved head without a rebuild, %d conflicts", len(done), s.rebased.Load(), conflicts)
	require.NotZero(t, s.rebased.Load(), "no publish was committed on a moved head: the run proves nothing")

	sort.Slice(done, func(i, j int) bool { return done[i].version < done[j].version })
	m, err := s.Manifest()
	require.NoError(t, err)
	first := m.Version - int64(len(done))
	for i, d := range done {
		require.Equal(t, first+int64(i)+1, d.version, "every version after the base is one publish's")
	}

	r := newTestStore(t, replayBase())
	leases := map[string]*Lease{}
	leaseFor := func(v int64) { // what leased version v, leased when the replay's head is v
		for _, d := range done {
			if d.baseVersion == v && !d.onHead {
				leases[d.txid] = mustLease(t, r, d.owner)
				require.Equal(t, v, leases[d.txid].ManifestVersion)
			}
		}
	}
	leaseFor(first)
	for _, d := range done {
		var res *PublishResult
		if d.onHead {
			res, err = r.CommitOnHead(context.Background(), PublishRequest{TxID: d.txid, Changes: d.changes, Owner: d.owner})
		} else {
			res, err = r.Publish(context.Background(), PublishRequest{TxID: d.txid, LeaseID: leases[d.txid].ID, Changes: d.changes, Owner: d.owner})
		}
		require.NoError(t, err, "replay of %s", d.txid)
		require.Equal(t, d.version, res.Revision.ManifestVersion, "replay of %s", d.txid)
		leaseFor(d.version)
	}
	require.Zero(t, r.rebased.Load())

	rm, err := r.Manifest()
	require.NoError(t, err)
	require.Len(t, rm.Layers, len(m.Layers))
	for i, l := range m.Layers {
		got, err := s.meta(l.ID)
		require.NoError(t, err)
		want, err := r.meta(rm.Layers[i].ID)
		require.NoError(t, err)
		require.Equal(t, want.TxID, got.TxID)
		require.Equal(t, want.Digest, got.Digest, "layer of %s (version %d)", got.TxID, got.ParentVersion+1)
		require.Equal(t, want.Paths, got.Paths, "layer of %s", got.TxID)
		require.Equal(t, want.Blame, got.Blame, "line owners of %s", got.TxID)
		require.Equal(t, want.ParentVersion, got.ParentVersion, "layer of %s", got.TxID)
	}
	require.Equal(t, readTree(t, r.Head()), readTree(t, s.Head()))
}

// assertNoErr reports err from any goroutine (require may not stop one
// that is not the test's).
func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
