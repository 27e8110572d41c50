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
// MaxEventsPerStream events per stream (older ones are dropped) and at most
// MaxSessions sessions (the least recently used is forgotten). A long-lived
// gateway serving chatty commands therefore holds a bounded amount.
//
// Having one also makes the server deliver every notification of a call
// before its result (mcp-go orders the two only with an event store).
type EventStore struct {
	MaxSessions        int
	MaxEventsPerStream int

	mu       sync.Mutex
	seq      int64
	lru      *list.List // of *sessionEvents, most recent first
	sessions map[string]*list.Element
}

type sessionEvents struct {
	id      string
	streams map[string][]storedEvent
	where   map[string]string // event id -> stream id
}

type storedEvent struct {
	id  string
	msg json.RawMessage
}

var _ mcpserver.EventStore = (*EventStore)(nil)

// NewEventStore returns a store with the default bounds (1024 sessions,
// 512 events per stream).
func NewEventStore() *EventStore {
	return &EventStore{MaxSessions: 1024, MaxEventsPerStream: 512, lru: list.New(), sessions: map[string]*list.Element{}}
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
	evs := append(se.streams[streamID], storedEvent{id: id, msg: append(json.RawMessage(nil), message...)})
	if over := len(evs) - s.MaxEventsPerStream; over > 0 {
		for _, e := range evs[:over] {
			delete(se.where, e.id)
		}
		evs = append([]storedEvent(nil), evs[over:]...)
	}
	se.streams[streamID] = evs
	se.where[id] = streamID
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

// Len reports how many sessions and events the store holds.
func (s *EventStore) Len() (sessions, events int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for el := s.lru.Front(); el != nil; el = el.Next() {
		for _, evs := range el.Value.(*sessionEvents).streams {
			events += len(evs)
		}
	}
	return s.lru.Len(), events
}
