package bench

import (
	"context"
	"net/http"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// timingTransport hands the Server-Timing header of each gateway answer
// to the timingSink of its request's context (withTimingSink), if any.
type timingTransport struct{ base http.RoundTripper }

type timingSinkKey struct{}

// timingSink receives the Server-Timing of a call's (last) answer.
type timingSink struct{ got api.ServerTiming }

func withTimingSink(ctx context.Context) (context.Context, *timingSink) {
	s := &timingSink{}
	return context.WithValue(ctx, timingSinkKey{}, s), s
}

func (t timingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if s, _ := req.Context().Value(timingSinkKey{}).(*timingSink); s != nil && err == nil {
		s.got = api.ParseServerTiming(resp.Header.Get(api.ServerTimingHeader))
	}
	return resp, err
}
