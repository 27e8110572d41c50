package client

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// fakeLines serves the JSON-lines protocol: echo the request, or an error
// for op "fail".
func fakeLines(t *testing.T, l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, err := jsonl.ReadLine(c, jsonl.MaxLine)
				if err != nil {
					return
				}
				req, e := jsonl.DecodeRequest(line)
				if e != nil {
					c.Write(jsonl.EncodeLine(api.Envelope{Error: e}))
					return
				}
				if req.Op == "fail" {
					c.Write(jsonl.EncodeLine(api.Envelope{Error: api.Errorf(api.KindOperationFailed, map[string]any{"x": 1}, "boom")}))
					return
				}
				c.Write(jsonl.EncodeLine(req))
			}()
		}
	}()
}

func TestJSONLinesTCPAndUnix(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	fakeLines(t, tl)
	sock := filepath.Join(t.TempDir(), "gw.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	fakeLines(t, ul)
	for _, ep := range []string{tl.Addr().String(), "tcp://" + tl.Addr().String(), "unix://" + sock} {
		c := New(ep, "tok")
		out, err := c.Call(context.Background(), "exec_command", jsonl.SandboxScope("eos-1"), map[string]any{"cmd": "ls"}, "rid-1")
		if err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
		var got jsonl.Request
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if got.Op != "exec_command" || got.RequestID != "rid-1" || got.Scope.SandboxID != "eos-1" || got.Token != "tok" || got.Args["cmd"] != "ls" {
			t.Errorf("%s: %+v", ep, got)
		}
		_, err = c.Call(context.Background(), "fail", jsonl.SystemScope(), nil, "")
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Kind != api.KindOperationFailed || ae.Details["x"] != float64(1) {
			t.Errorf("%s: %v", ep, err)
		}
	}
	_, err = New("127.0.0.1:1", "").Call(context.Background(), "list_sandboxes", jsonl.SystemScope(), nil, "")
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Kind != KindConnection {
		t.Errorf("want connection_error, got %v", err)
	}
}

func TestHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(401)
			json.NewEncoder(w).Encode(api.Envelope{Error: api.Errorf(api.KindUnauthorized, nil, "no")})
			return
		}
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		body["path"] = r.URL.Path
		json.NewEncoder(w).Encode(body)
	}))
	defer srv.Close()
	out, err := New(srv.URL, "tok").Call(context.Background(), "file_read", jsonl.SandboxScope("eos-1"), map[string]any{"path": "a"}, "r1")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	json.Unmarshal(out, &got)
	if got["path"] != "/v1/ops/file_read" || got["request_id"] != "r1" {
		t.Errorf("%v", got)
	}
	_, err = New(srv.URL, "bad").Call(context.Background(), "file_read", jsonl.SandboxScope("eos-1"), nil, "")
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Kind != api.KindUnauthorized {
		t.Errorf("%v", err)
	}
}

func TestToken(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "gateway.token")
	tok, err := EnsureToken(p)
	if err != nil || len(tok) != 64 {
		t.Fatalf("%q %v", tok, err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
	if again, err := EnsureToken(p); err != nil || again != tok {
		t.Errorf("second ensure: %q %v", again, err)
	}
	os.Chmod(p, 0o644)
	if _, err := ReadToken(p); err == nil {
		t.Error("group-readable token accepted")
	}
}

func TestRequestID(t *testing.T) {
	a, b := NewRequestID(), NewRequestID()
	if a == b || len(a) != 36 {
		t.Errorf("%s %s", a, b)
	}
}
