package telemetry

import (
	"sync"
	"sync/atomic"
	"time"
)

// Sampler defaults (the seed's resource_stats.sample_interval_ms and how
// long a request keeps it awake).
const (
	DefaultSampleInterval = 2 * time.Second
	DefaultIdleAfter      = 10 * time.Second
)

// SamplerOptions configure a Sampler.
type SamplerOptions struct {
	Interval  time.Duration
	IdleAfter time.Duration
	// Busy reports work that keeps sampling alive however long ago the last
	// request was (running commands).
	Busy func() bool
	// Collect takes one round of samples.
	Collect func(now time.Time)
	Now     func() time.Time
}

// Sampler calls Collect every Interval, but only while the sandbox is
// active: from a Touch until IdleAfter has passed without one and Busy is
// false. Then its goroutine exits, so an idle sandbox has no timer, no
// goroutine and does no observability work at all; the next Touch starts it
// again (and samples at once).
type Sampler struct {
	o SamplerOptions

	mu      sync.Mutex
	running bool
	closed  bool
	last    time.Time
	stop    chan struct{}
	wg      sync.WaitGroup

	starts atomic.Uint64
	rounds atomic.Uint64
}

// NewSampler returns a stopped sampler.
func NewSampler(o SamplerOptions) *Sampler {
	if o.Interval <= 0 {
		o.Interval = DefaultSampleInterval
	}
	if o.IdleAfter <= 0 {
		o.IdleAfter = DefaultIdleAfter
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Busy == nil {
		o.Busy = func() bool { return false }
	}
	return &Sampler{o: o, stop: make(chan struct{})}
}

// Touch records activity and starts the sampler if it is not running.
func (s *Sampler) Touch() {
	if s == nil {
		return
	}
	now := s.o.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = now
	if s.running || s.closed {
		return
	}
	s.running = true
	s.starts.Add(1)
	s.wg.Add(1)
	go s.loop()
}

// SamplerStats describe the sampler for the daemon view.
type SamplerStats struct {
	Running    bool  `json:"running"`
	IntervalMS int64 `json:"interval_ms"`
	IdleMS     int64 `json:"idle_after_ms"`
	Starts     int64 `json:"starts"`
	Rounds     int64 `json:"rounds"`
}

// Stats returns whether the sampler runs and how often it ran.
func (s *Sampler) Stats() SamplerStats {
	s.mu.Lock()
	running := s.running
	s.mu.Unlock()
	return SamplerStats{Running: running, IntervalMS: s.o.Interval.Milliseconds(), IdleMS: s.o.IdleAfter.Milliseconds(),
		Starts: int64(s.starts.Load()), Rounds: int64(s.rounds.Load())}
}

// Close stops the sampler and waits for its goroutine.
func (s *Sampler) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Sampler) loop() {
	defer s.wg.Done()
	t := time.NewTimer(0) // sample at once: a short burst is seen too
	defer t.Stop()
	for first := true; ; first = false {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		busy := s.o.Busy()
		now := s.o.Now()
		s.mu.Lock()
		if !first && !busy && now.Sub(s.last) >= s.o.IdleAfter {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		s.o.Collect(now)
		s.rounds.Add(1)
		t.Reset(s.o.Interval)
	}
}
