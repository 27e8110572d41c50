package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	_, n := s.Len()
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
	sessions, _ := s.Len()
	require.Equal(t, 3, sessions, "the least recently used sessions are forgotten")
	_, err = s.ReplayEventsAfter(ctx, "s1", ids[9], func(string, json.RawMessage) error { return nil })
	require.Error(t, err)

	require.NoError(t, s.PurgeSession(ctx, "s5"))
	sessions, _ = s.Len()
	require.Equal(t, 2, sessions)
}
