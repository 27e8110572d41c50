package telemetry

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSamplerRunsOnlyWhileActive(t *testing.T) {
	var rounds atomic.Int64
	var busy atomic.Bool
	s := NewSampler(SamplerOptions{Interval: 5 * time.Millisecond, IdleAfter: 300 * time.Millisecond,
		Busy: busy.Load, Collect: func(time.Time) { rounds.Add(1) }})
	defer s.Close()

	require.False(t, s.Stats().Running, "a new sampler does nothing")
	require.Never(t, func() bool { return rounds.Load() > 0 }, 30*time.Millisecond, 5*time.Millisecond, "no samples before any activity")

	s.Touch()
	require.Eventually(t, func() bool { return rounds.Load() >= 3 }, 5*time.Second, time.Millisecond, "samples while active")
	require.Eventually(t, func() bool { return !s.Stats().Running }, 5*time.Second, time.Millisecond, "stops once idle")
	idle := rounds.Load()
	require.Never(t, func() bool { return rounds.Load() != idle }, 100*time.Millisecond, 5*time.Millisecond, "no samples while idle")

	// Busy work (a running command) keeps it alive past IdleAfter.
	busy.Store(true)
	s.Touch()
	start := rounds.Load()
	require.Eventually(t, func() bool { return rounds.Load() > start+20 }, 5*time.Second, time.Millisecond)
	require.True(t, s.Stats().Running, "busy keeps the sampler running")
	busy.Store(false)
	require.Eventually(t, func() bool { return !s.Stats().Running }, 5*time.Second, time.Millisecond)
	require.Equal(t, int64(2), s.Stats().Starts)

	s.Close()
	s.Touch()
	require.False(t, s.Stats().Running, "a closed sampler does not start")
}
