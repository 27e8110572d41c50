package layerstack

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkPublish measures a whole publish (freeze, resolve, build,
// fsync, manifest commit) of n new 4 KiB files from one session.
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) { benchPublish(b, n) })
	}
}

// BenchmarkPublishSyncfs is BenchmarkPublish with the commit flushed by one
// syncfs whatever its size, against the batch of concurrent fsyncs a small
// commit uses: which is cheaper depends on what else is dirty on the volume.
func BenchmarkPublishSyncfs(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			defer func(v int) { commitSyncfsAbove = v }(commitSyncfsAbove)
			commitSyncfsAbove = -1
			benchPublish(b, n)
		})
	}
}

func benchPublish(b *testing.B, n int) {
	s := newTestStore(b, tree{"README": "r\n"}, Options{AutoSquashAt: -1})
	payload := make([]byte, 4096)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		l := mustLease(b, s, sess1)
		cs := &ChangeSet{}
		for k := 0; k < n; k++ {
			cs.Changes = append(cs.Changes, Change{Path: fmt.Sprintf("p%d/d%d/f%d.txt", i, k%10, k), Kind: ChangeWrite, Mode: 0o644, Data: payload})
		}
		b.StartTimer()
		_, err := s.Publish(context.Background(), PublishRequest{TxID: fmt.Sprintf("b-%d-%d", n, i), LeaseID: l.ID, Changes: cs, Owner: sess1})
		b.StopTimer()
		require.NoError(b, err)
		require.NoError(b, s.Release(l.ID))
		b.StartTimer()
	}
}

// BenchmarkPublishMerge publishes an edit of a 10k-line file that another
// session also edited (so the publish runs a three-way merge).
func BenchmarkPublishMerge(b *testing.B) {
	base := lines(10000, func(i int) string { return fmt.Sprintf("line %d of the file", i) })
	s := newTestStore(b, tree{"big.txt": base}, Options{AutoSquashAt: -1})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cur := headFile(b, s, "big.txt")
		l1, l2 := mustLease(b, s, sess1), mustLease(b, s, sess2)
		_, err := publishOn(b, s, l1, sess1, writes("big.txt", cur+"head "+fmt.Sprint(i)+"\n"))
		require.NoError(b, err)
		ours := "ours " + fmt.Sprint(i) + "\n" + cur
		b.StartTimer()
		_, err = publishOn(b, s, l2, sess2, writes("big.txt", ours))
		b.StopTimer()
		require.NoError(b, err)
		require.NoError(b, s.Release(l1.ID))
		require.NoError(b, s.Release(l2.ID))
		b.StartTimer()
	}
}

// BenchmarkViewStat looks up a base file through a stack of the given depth.
func BenchmarkViewStat(b *testing.B) {
	for _, depth := range []int{1, 50, 200} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			s := newTestStore(b, tree{"src/pkg/deep/file.go": "package deep\n"}, Options{AutoSquashAt: -1})
			for i := 1; i < depth; i++ {
				_, err := publishOn(b, s, mustLease(b, s, sess1), sess1, writes(fmt.Sprintf("src/gen/f%d.go", i), "x"))
				require.NoError(b, err)
			}
			m, _ := s.Manifest()
			require.Len(b, m.Layers, depth)
			v := s.Head()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := v.Stat("src/pkg/deep/file.go"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSquash100 folds 100 layers of 10 files each into one.
func BenchmarkSquash100(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s := newTestStore(b, tree{"a": "a"}, Options{AutoSquashAt: -1})
		for k := 0; k < 100; k++ {
			cs := &ChangeSet{}
			for f := 0; f < 10; f++ {
				cs.Changes = append(cs.Changes, Change{Path: fmt.Sprintf("d%d/f%d", f, k), Kind: ChangeWrite, Mode: 0o644, Data: []byte("content")})
			}
			l := mustLease(b, s, sess1)
			_, err := publishOn(b, s, l, sess1, cs)
			require.NoError(b, err)
			require.NoError(b, s.Release(l.ID))
		}
		b.StartTimer()
		res, err := s.Squash(context.Background())
		b.StopTimer()
		require.NoError(b, err)
		require.Len(b, res.SquashedBlocks, 1)
		b.StartTimer()
	}
}

// BenchmarkPublishSideBySide: 8 sessions publish one new file each, in a
// directory of their own (as captured: the directory listed too), side by
// side on one store. A publish whose head moved under its build commits
// the layer it built on the new head (rebase=true) or builds it again
// (rebase=false, the code before). rebased/op is the share that did.
func BenchmarkPublishSideBySide(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("rebase=%v", on), func(b *testing.B) {
			defer func(v bool) { rebaseOnMovedHead = v }(rebaseOnMovedHead)
			rebaseOnMovedHead = on
			s := newTestStore(b, tree{"README": "r\n"}, Options{AutoSquashAt: -1})
			payload := make([]byte, 4096)
			const writers = 8
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			b.ResetTimer()
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					owner := fmt.Sprintf("workspace_session:w%d", w)
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						l, err := s.Acquire(owner)
						if err == nil {
							cs := &ChangeSet{Changes: []Change{{Path: fmt.Sprintf("w%d", w), Kind: ChangeDir, Mode: 0o755},
								{Path: fmt.Sprintf("w%d/f%d.txt", w, i), Kind: ChangeWrite, Mode: 0o644, Data: payload}}}
							_, err = s.Publish(context.Background(), PublishRequest{TxID: fmt.Sprintf("side-%d", i), LeaseID: l.ID, Changes: cs, Owner: owner})
							if rerr := s.Release(l.ID); err == nil {
								err = rerr
							}
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			require.NoError(b, <-errs)
			b.ReportMetric(float64(s.rebased.Load())/float64(b.N), "rebased/op")
		})
	}
}
