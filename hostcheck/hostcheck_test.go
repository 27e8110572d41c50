package hostcheck

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAllowed(t *testing.T) {
	gw := For("127.0.0.1:7878")
	wide := For("0.0.0.0:9000", "10.1.2.3:9000")
	lo := Loopback()
	for _, tc := range []struct {
		p     *Policy
		host  string
		allow bool
	}{
		{gw, "127.0.0.1:7878", true},
		{gw, "localhost:7878", true},
		{gw, "LOCALHOST:7878", true},
		{gw, "[::1]:7878", true},
		{gw, "127.0.0.1:7879", false},
		{gw, "127.0.0.1", false},
		{gw, "evil.example:7878", false},
		{gw, "evil.example", false},
		{gw, "", false},
		{wide, "10.1.2.3:9000", true},
		{wide, "127.0.0.1:9000", true},
		{wide, "evil.example:9000", false},
		{lo, "127.0.0.1:32768", true},
		{lo, "127.0.0.2:1", true},
		{lo, "[::1]:5", true},
		{lo, "localhost:7001", true},
		{lo, "127.0.0.1", true},
		{lo, "evil.example", false},
		{lo, "evil.example:7001", false},
		{lo, "10.0.0.1:7001", false},
		{lo, "127.0.0.1.evil.example:80", false},
	} {
		require.Equal(t, tc.allow, tc.p.Allowed(tc.host), "%q", tc.host)
	}
}

func TestHandlerRefusesAndSendsNoCORS(t *testing.T) {
	h := Loopback().Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		_, _ = w.Write([]byte("ok"))
	}))
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, "127.0.0.1:1": http.StatusOK} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, want, w.Code, host)
		require.Empty(t, w.Header().Get("Access-Control-Allow-Origin"))
	}
}
