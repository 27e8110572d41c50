package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// eventsBackend answers the events op from a growing list like the daemon
// does: newest first, since_ms exclusive.
type eventsBackend struct {
	fakeBackend
	mu     sync.Mutex
	events []map[string]any
	asked  []map[string]any
}

func (b *eventsBackend) Runtime(ctx context.Context, op, id string, args map[string]any) (any, error) {
	if op != "events" {
		return b.fakeBackend.Runtime(ctx, op, id, args)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, args)
	since := int64(0)
	if v, ok := args["since_ms"].(json.Number); ok {
		since, _ = v.Int64()
	}
	out := []map[string]any{}
	for i := len(b.events) - 1; i >= 0; i-- {
		if e := b.events[i]; e["ts"].(time.Time).UnixMilli() > since {
			out = append(out, e)
		}
	}
	return map[string]any{"view": "events", "events": out}, nil
}

func (b *eventsBackend) add(name string, at time.Time) {
	b.mu.Lock()
	b.events = append(b.events, map[string]any{"ts": at, "name": name, "attrs": map[string]any{}})
	b.mu.Unlock()
}

func TestEventsStreamSSE(t *testing.T) {
	b := &eventsBackend{}
	t0 := time.Now().Add(-time.Minute)
	b.add("workspace_session.created", t0)
	b.add("workspace_session.published", t0.Add(time.Second))
	addr := startWith(t, b, func(s *Server) { s.StreamPoll = 10 * time.Millisecond })

	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sandboxes/eos-1/events/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	br := bufio.NewReader(resp.Body)
	first := readEvents(t, br, 2)
	require.Len(t, first, 2)
	require.Contains(t, first[0].data, "workspace_session.created")
	require.Contains(t, first[1].data, "workspace_session.published")

	// A new event arrives once, after the ones already sent.
	b.add("workspace_session.destroyed", time.Now())
	next := readEvents(t, br, 1)
	require.Len(t, next, 1)
	require.Equal(t, "event", next[0].name)
	require.Contains(t, next[0].data, "workspace_session.destroyed")
}

// An event in the same millisecond as the last one streamed still arrives,
// and nothing arrives twice.
func TestEventsStreamSameMillisecond(t *testing.T) {
	b := &eventsBackend{}
	at := time.Now().Truncate(time.Millisecond)
	b.add("first", at)
	addr := startWith(t, b, func(s *Server) { s.StreamPoll = 10 * time.Millisecond })
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sandboxes/eos-1/events/stream", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	require.Contains(t, readEvents(t, br, 1)[0].data, "first")
	b.add("second", at.Add(500*time.Microsecond)) // the same millisecond
	b.add("third", at.Add(2*time.Millisecond))
	next := readEvents(t, br, 2)
	require.Contains(t, next[0].data, "second")
	require.Contains(t, next[1].data, "third")
	b.add("fourth", at.Add(3*time.Millisecond))
	last := readEvents(t, br, 1)
	require.Contains(t, last[0].data, "fourth", "nothing is sent twice")
}
