package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
)

func TestConsoleBase(t *testing.T) {
	for ep, want := range map[string]string{
		"127.0.0.1:7878":         "http://127.0.0.1:7878",
		"tcp://127.0.0.1:7878":   "http://127.0.0.1:7878",
		"http://localhost:7878/": "http://localhost:7878",
	} {
		got, err := consoleBase(ep)
		if err != nil || got != want {
			t.Errorf("consoleBase(%q) = %q, %v; want %q", ep, got, err, want)
		}
	}
	for _, ep := range []string{"unix:///run/gw.sock", "/run/gw.sock", "ftp://x:1"} {
		if _, err := consoleBase(ep); err == nil {
			t.Errorf("consoleBase(%q): want a usage error", ep)
		}
	}
}

// The console subcommand asks for a code with the bearer token and prints
// the URL as one JSON line; a refusal prints the gateway's envelope.
func TestConsoleCommand(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/console/code" || r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(api.Envelope{Error: api.Errorf(api.KindUnauthorized, nil, "missing or invalid gateway auth token")})
			return
		}
		_, _ = w.Write([]byte(`{"code":"c1","url":"http://` + r.Host + `/#login=c1","expires_in_s":120}`))
	}))
	defer srv.Close()
	t.Setenv("DISPLAY", "")
	t.Setenv("WAYLAND_DISPLAY", "")
	ep := strings.TrimPrefix(srv.URL, "http://")
	var out, errb bytes.Buffer
	if code := Main(api.GroupManagement, []string{"--gateway-endpoint", ep, "--gateway-auth-token", "tok", "console"}, &out, &errb); code != ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got["url"] != "http://"+ep+"/#login=c1" || got["opened"] != false {
		t.Fatalf("stdout %q", out.String())
	}
	out.Reset()
	errb.Reset()
	if code := Main(api.GroupManagement, []string{"--gateway-endpoint", ep, "--gateway-auth-token", "wrong", "console"}, &out, &errb); code != ExitError {
		t.Fatalf("wrong token: exit %d", code)
	}
	if !strings.Contains(errb.String(), `"kind":"unauthorized"`) {
		t.Fatalf("stderr %q", errb.String())
	}
}
