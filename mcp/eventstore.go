package mcp

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	mcpserver "github.com/mark3labs/mcp-go/server"
)

// EventStore keeps the recent SSE events of streamable HTTP sessions so a
// client can resume a broken stream, within fixed bounds: at most
// MaxEventsPerStream events a stream, MaxStreamsPerSession streams (one per
// request; the oldest goes first) and MaxBytesPerSession bytes a session,
// and MaxSessions sessions (the least recently used is forgotten). A
// long-lived gateway serving chatty commands holds at most about
// MaxSessions x MaxBytesPerSession.
//
// Having one also makes the server deliver every notification of a call
// before its result (mcp-go orders the two only with an event store).
type EventStore struct {
	MaxSessions          int
	MaxEventsPerStream   int
	MaxStreamsPerSession int
	MaxBytesPerSession   int

	mu       sync.Mutex
	seq      int64
	lru      *list.List // of *sessionEvents, most recent first
	sessions map[string]*list.Element
}

type sessionEvents struct {
	id      string
	streams map[string][]storedEvent
	order   []string          // stream ids, oldest first
	where   map[string]string // event id -> stream id
	bytes   int
}

// dropOldest forgets a session's oldest stream.
func (se *sessionEvents) dropOldest() {
	old := se.order[0]
	se.order = se.order[1:]
	for _, e := range se.streams[old] {
		delete(se.where, e.id)
		se.bytes -= len(e.msg)
	}
	delete(se.streams, old)
}

type storedEvent struct {
	id  string
	msg json.RawMessage
}

var _ mcpserver.EventStore = (*EventStore)(nil)

// NewEventStore returns a store with the default bounds: 256 sessions of at
// most 32 streams, 512 events a stream and 1 MiB each (256 MiB at most).
func NewEventStore() *EventStore {
	return &EventStore{MaxSessions: 256, MaxEventsPerStream: 512, MaxStreamsPerSession: 32, MaxBytesPerSession: 1 << 20,
		lru: list.New(), sessions: map[string]*list.Element{}}
}

func (s *EventStore) session(id string, create bool) *sessionEvents {
	if el, ok := s.sessions[id]; ok {
		s.lru.MoveToFront(el)
		return el.Value.(*sessionEvents)
	}
	if !create {
		return nil
	}
	se := &sessionEvents{id: id, streams: map[string][]storedEvent{}, where: map[string]string{}}
	s.sessions[id] = s.lru.PushFront(se)
	for s.lru.Len() > s.MaxSessions {
		old := s.lru.Remove(s.lru.Back()).(*sessionEvents)
		delete(s.sessions, old.id)
	}
	return se
}

// StoreEvent implements mcpserver.EventStore.
func (s *EventStore) StoreEvent(_ context.Context, sessionID, streamID string, message json.RawMessage) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.session(sessionID, true)
	s.seq++
	id := strconv.FormatInt(s.seq, 10)
	if _, ok := se.streams[streamID]; !ok {
		se.order = append(se.order, streamID)
	}
	evs := append(se.streams[streamID], storedEvent{id: id, msg: append(json.RawMessage(nil), message...)})
	se.bytes += len(message)
	if over := len(evs) - s.MaxEventsPerStream; over > 0 {
		for _, e := range evs[:over] {
			delete(se.where, e.id)
			se.bytes -= len(e.msg)
		}
		evs = append([]storedEvent(nil), evs[over:]...)
	}
	se.streams[streamID] = evs
	se.where[id] = streamID
	for len(se.order) > 1 && (len(se.order) > s.MaxStreamsPerSession || se.bytes > s.MaxBytesPerSession) {
		se.dropOldest()
	}
	// One stream alone over the budget keeps its newest events.
	for only := se.streams[streamID]; se.bytes > s.MaxBytesPerSession && len(only) > 1; only = se.streams[streamID] {
		delete(se.where, only[0].id)
		se.bytes -= len(only[0].msg)
		se.streams[streamID] = only[1:]
	}
	return id, nil
}

// ReplayEventsAfter implements mcpserver.EventStore.
func (s *EventStore) ReplayEventsAfter(ctx context.Context, sessionID, lastEventID string, send func(eventID string, message json.RawMessage) error) (string, error) {
	s.mu.Lock()
	se := s.session(sessionID, false)
	var stream string
	var tail []storedEvent
	if se != nil {
		stream = se.where[lastEventID]
		for i, e := range se.streams[stream] {
			if e.id == lastEventID {
				tail = append(tail, se.streams[stream][i+1:]...)
				break
			}
		}
	}
	s.mu.Unlock()
	if se == nil || stream == "" {
		return "", fmt.Errorf("%w: %s", mcpserver.ErrUnknownEventID, lastEventID)
	}
	for _, e := range tail {
		if err := send(e.id, e.msg); err != nil {
			return "", err
		}
	}
	return stream, nil
}

// PurgeSession implements mcpserver.EventStore.
func (s *EventStore) PurgeSession(_ context.Context, sessionID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.sessions[sessionID]; ok {
		s.lru.Remove(el)
		delete(s.sessions, sessionID)
	}
	return nil
}

// Len reports how many sessions, events and bytes the store holds.
func (s *EventStore) Len() (sessions, events, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for el := s.lru.Front(); el != nil; el = el.Next() {
		se := el.Value.(*sessionEvents)
		for _, evs := range se.streams {
			events += len(evs)
		}
		bytes += se.bytes
	}
	return s.lru.Len(), events, bytes
}
