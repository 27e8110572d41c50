package bench

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Sample is one timed operation: the raw CSV row.
type Sample struct {
	Scenario    string
	Case        string // what varies inside the scenario: "ours", "docker exec", "100 files"...
	Op          string // operation class
	Concurrency int
	Latency     time.Duration
	Err         bool
}

// Recorder collects samples from concurrent workers.
type Recorder struct {
	mu      sync.Mutex
	samples []Sample
}

// Add records one sample.
func (r *Recorder) Add(s Sample) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

// All returns every sample so far.
func (r *Recorder) All() []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Sample(nil), r.samples...)
}

// Select returns the latencies of the successful samples matching the
// scenario, case and op ("" matches any), and how many failed.
func (r *Recorder) Select(scenario, cas, op string, c int) (lat []time.Duration, errs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.samples {
		if s.Scenario != scenario || (cas != "" && s.Case != cas) || (op != "" && s.Op != op) || (c > 0 && s.Concurrency != c) {
			continue
		}
		if s.Err {
			errs++
			continue
		}
		lat = append(lat, s.Latency)
	}
	return lat, errs
}

// Summary are the order statistics of a set of latencies.
type Summary struct {
	N                   int
	Errors              int
	P50, P95, P99, Mean time.Duration
	Max                 time.Duration
	OpsPerSec           float64 // N over the wall time of the run (0 if unknown)
}

// Summarize computes nearest-rank percentiles.
func Summarize(lat []time.Duration, errs int, wall time.Duration) Summary {
	s := Summary{N: len(lat), Errors: errs}
	if len(lat) == 0 {
		return s
	}
	sorted := append([]time.Duration(nil), lat...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	s.Mean = sum / time.Duration(len(sorted))
	s.P50, s.P95, s.P99 = percentile(sorted, .50), percentile(sorted, .95), percentile(sorted, .99)
	s.Max = sorted[len(sorted)-1]
	if wall > 0 {
		s.OpsPerSec = float64(len(lat)) / wall.Seconds()
	}
	return s
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// Ms renders a duration in milliseconds with three significant digits.
func Ms(d time.Duration) float64 {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms >= 100:
		return math.Round(ms)
	case ms >= 10:
		return math.Round(ms*10) / 10
	case ms >= 1:
		return math.Round(ms*100) / 100
	}
	return math.Round(ms*1000) / 1000
}

// Load runs n operations on c workers, each worker first doing one untimed
// warm-up (connections, caches), and records each timed operation. It
// returns the wall time of the timed part.
func Load(rec *Recorder, scenario, cas, op string, c, n int, fn func(worker, i int) error) time.Duration {
	for w := 0; w < c; w++ {
		_ = fn(w, -1)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				err := fn(w, i)
				rec.Add(Sample{Scenario: scenario, Case: cas, Op: op, Concurrency: c, Latency: time.Since(t0), Err: err != nil})
			}
		}(w)
	}
	wg.Wait()
	return time.Since(start)
}

// Len is how many samples the recorder holds: a mark for P50Since.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.samples)
}

// P50Since is the p50 of the successful samples of scenario and case
// recorded after mark (0 when there are none).
func (r *Recorder) P50Since(mark int, scenario, cas string) time.Duration {
	r.mu.Lock()
	var lat []time.Duration
	for _, s := range r.samples[min(mark, len(r.samples)):] {
		if s.Scenario == scenario && s.Case == cas && !s.Err {
			lat = append(lat, s.Latency)
		}
	}
	r.mu.Unlock()
	return Summarize(lat, 0, 0).P50
}

// Rounds are the same-run ratios of several rounds of a comparison (the
// baseline's p50 over ours, each round ours then the baseline): their
// median and spread say more on a noisy machine than one pooled ratio.
type Rounds []float64

// Add records one round's ratio base/ours (a round without both is skipped).
func (rs *Rounds) Add(base, ours time.Duration) {
	if base > 0 && ours > 0 {
		*rs = append(*rs, float64(base)/float64(ours))
	}
}

// Median of the rounds' ratios (0 with none).
func (rs Rounds) Median() float64 {
	if len(rs) == 0 {
		return 0
	}
	c := append([]float64(nil), rs...)
	sort.Float64s(c)
	return c[len(c)/2]
}

// String: "2.1x (1.8–2.4 over 3 rounds)".
func (rs Rounds) String() string {
	if len(rs) == 0 {
		return "–"
	}
	c := append([]float64(nil), rs...)
	sort.Float64s(c)
	return fmt.Sprintf("%sx (%s–%s over %d rounds)", sig3(rs.Median()), sig2(c[0]), sig2(c[len(c)-1]), len(c))
}
