package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/mcp"
)

func TestEventStoreIsBoundedAndReplays(t *testing.T) {
	s := mcp.NewEventStore()
	s.MaxSessions, s.MaxEventsPerStream = 3, 4
	ctx := context.Background()
	var ids []string
	for i := 0; i < 10; i++ {
		id, err := s.StoreEvent(ctx, "s1", "st", json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)))
		require.NoError(t, err)
		ids = append(ids, id)
	}
	_, n, _ := s.Len()
	require.Equal(t, 4, n, "a stream keeps its newest events only")

	var got []string
	stream, err := s.ReplayEventsAfter(ctx, "s1", ids[7], func(id string, m json.RawMessage) error {
		got = append(got, string(m))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "st", stream)
	require.Equal(t, []string{`{"n":8}`, `{"n":9}`}, got)

	_, err = s.ReplayEventsAfter(ctx, "s1", ids[0], func(string, json.RawMessage) error { return nil })
	require.True(t, errors.Is(err, mcpserver.ErrUnknownEventID), "a dropped event cannot be resumed from")

	for i := 2; i <= 5; i++ {
		_, err := s.StoreEvent(ctx, fmt.Sprintf("s%d", i), "st", json.RawMessage(`{}`))
		require.NoError(t, err)
	}
	sessions, _, _ := s.Len()
	require.Equal(t, 3, sessions, "the least recently used sessions are forgotten")
	_, err = s.ReplayEventsAfter(ctx, "s1", ids[9], func(string, json.RawMessage) error { return nil })
	require.Error(t, err)

	require.NoError(t, s.PurgeSession(ctx, "s5"))
	sessions, _, _ = s.Len()
	require.Equal(t, 2, sessions)
}

// One session's many requests (a stream each) stay within its stream and
// byte caps, the oldest streams going first.
func TestEventStoreBoundsStreamsAndBytes(t *testing.T) {
	s := mcp.NewEventStore()
	s.MaxStreamsPerSession, s.MaxBytesPerSession = 5, 10<<10
	ctx := context.Background()
	var first string
	for i := 0; i < 100; i++ {
		id, err := s.StoreEvent(ctx, "s1", fmt.Sprintf("request-%d", i), json.RawMessage(`"`+strings.Repeat("x", 500)+`"`))
		require.NoError(t, err)
		if i == 0 {
			first = id
		}
	}
	_, events, bytes := s.Len()
	require.LessOrEqual(t, events, 5)
	require.LessOrEqual(t, bytes, 10<<10)
	_, err := s.ReplayEventsAfter(ctx, "s1", first, func(string, json.RawMessage) error { return nil })
	require.Error(t, err, "the oldest request's stream is gone")
	require.NoError(t, s.PurgeSession(ctx, "s1"))
	for i := 0; i < 40; i++ { // one big stream alone: its oldest events go
		_, err := s.StoreEvent(ctx, "s2", "big", json.RawMessage(`"`+strings.Repeat("y", 1000)+`"`))
		require.NoError(t, err)
	}
	_, events, bytes = s.Len()
	require.LessOrEqual(t, bytes, 10<<10)
	require.Equal(t, 10, events, "ten 1 KiB events fit in 10 KiB")
}
