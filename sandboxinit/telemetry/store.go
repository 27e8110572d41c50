package telemetry

import (
	"errors"
	"time"
)

// DefaultPublishBudget bounds the publish history (both segments).
const DefaultPublishBudget = 1 << 20

// Options size a Store; zero values are the defaults.
type Options struct {
	EventBudget   int64 // spans and events, default 4 MiB
	SampleBudget  int64 // resource samples, default 1 MiB
	PublishBudget int64 // publish outcomes, default 1 MiB
	Now           func() time.Time
}

// Store is the daemon's observability store: three bounded streams in one
// directory of the state volume, so what they hold survives daemon and
// container restarts.
type Store struct {
	Dir       string
	Events    *Stream // kind span and event
	Samples   *Stream // kind sample
	Publishes *Stream // kind publish
	Tracer    *Tracer
}

// Open opens the store in dir. Nothing is written until the first record.
func Open(dir string, o Options) (*Store, error) {
	if o.EventBudget == 0 {
		o.EventBudget = DefaultEventBudget
	}
	if o.SampleBudget == 0 {
		o.SampleBudget = DefaultSampleBudget
	}
	if o.PublishBudget == 0 {
		o.PublishBudget = DefaultPublishBudget
	}
	s := &Store{Dir: dir}
	var err error
	if s.Events, err = OpenStream(dir, "events", o.EventBudget); err != nil {
		return nil, err
	}
	if s.Samples, err = OpenStream(dir, "samples", o.SampleBudget); err != nil {
		return nil, err
	}
	if s.Publishes, err = OpenStream(dir, "publishes", o.PublishBudget); err != nil {
		return nil, err
	}
	s.Tracer = NewTracer(s.Events, "d", o.Now)
	return s, nil
}

// Streams returns the streams in a fixed order.
func (s *Store) Streams() []*Stream { return []*Stream{s.Events, s.Samples, s.Publishes} }

// Dropped is the sum of every stream's drop counter.
func (s *Store) Dropped() uint64 {
	var n uint64
	for _, st := range s.Streams() {
		n += st.dropped.Load()
	}
	return n
}

// Close closes the streams.
func (s *Store) Close() error {
	var errs []error
	for _, st := range s.Streams() {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}
