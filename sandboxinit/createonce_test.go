package sandboxinit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A create under a request id runs once: a second call under the same id
// while the first runs waits for it and answers its session; a later one
// answers the session that exists; a create that failed leaves nothing
// to answer, so the next call creates; other ids and no id create.
func TestCreateOnceByRequestID(t *testing.T) {
	d := &Daemon{sessions: map[string]*session{}}
	made := 0
	release := make(chan struct{})
	create := func(id, rid string, hold bool) func() (*session, error) {
		return func() (*session, error) {
			made++
			if hold {
				<-release
			}
			s := &session{rec: sessionRecord{ID: id, CreatedBy: rid}}
			d.mu.Lock()
			d.sessions[id] = s
			d.mu.Unlock()
			return s, nil
		}
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	var first *session
	wg.Add(1)
	go func() {
		defer wg.Done()
		s, err := d.createOnce(ctx, "r1", create("ws-1", "r1", true))
		require.NoError(t, err)
		first = s
	}()
	require.Eventually(t, func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.creatingBy["r1"] != nil }, 5*time.Second, time.Millisecond)
	second := make(chan *session, 1)
	go func() {
		s, err := d.createOnce(ctx, "r1", create("ws-dup", "r1", false))
		require.NoError(t, err)
		second <- s
	}()
	close(release)
	wg.Wait()
	require.Equal(t, "ws-1", (<-second).rec.ID, "the retry answers the first create's session")
	again, err := d.createOnce(ctx, "r1", create("ws-dup2", "r1", false))
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Equal(t, 1, made)

	_, err = d.createOnce(ctx, "r2", func() (*session, error) { made++; return nil, errors.New("no room") })
	require.Error(t, err)
	s, err := d.createOnce(ctx, "r2", create("ws-2", "r2", false))
	require.NoError(t, err)
	require.Equal(t, "ws-2", s.rec.ID, "a failed create made nothing: the retry creates")
	s, err = d.createOnce(ctx, "", create("ws-3", "", false))
	require.NoError(t, err)
	require.Equal(t, "ws-3", s.rec.ID)
	require.Equal(t, 4, made)

	// A waiter gives up with its context.
	hold := make(chan struct{})
	go func() {
		_, _ = d.createOnce(ctx, "r4", func() (*session, error) { <-hold; return nil, errors.New("late") })
	}()
	require.Eventually(t, func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.creatingBy["r4"] != nil }, 5*time.Second, time.Millisecond)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = d.createOnce(cctx, "r4", create("ws-4", "r4", false))
	require.ErrorIs(t, err, context.Canceled)
	close(hold)
}
