package client

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

func TestCallProgressJSONLines(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			line, _ := jsonl.ReadLine(c, jsonl.MaxLine)
			req, _ := jsonl.DecodeRequest(line)
			if req != nil && req.StreamLogs {
				c.Write([]byte("cli_log(\"creating sandbox eos-1\")\ncli_log(\"a \\\"quoted\\\" line\")\n"))
			}
			c.Write([]byte(`{"id":"eos-1"}` + "\n"))
			c.Close()
		}
	}()
	cl := New(l.Addr().String(), "tok")
	var msgs []string
	out, err := cl.CallProgress(context.Background(), "create_sandbox", jsonl.SystemScope(), nil, "", func(m string) { msgs = append(msgs, m) })
	if err != nil || string(out) != `{"id":"eos-1"}` {
		t.Fatalf("%s %v", out, err)
	}
	if got := strings.Join(msgs, "|"); got != `creating sandbox eos-1|a "quoted" line` {
		t.Fatalf("progress %q", got)
	}
	out, err = cl.Call(context.Background(), "create_sandbox", jsonl.SystemScope(), nil, "")
	if err != nil || string(out) != `{"id":"eos-1"}` {
		t.Fatalf("plain: %s %v", out, err)
	}
}

func TestCallProgressSSE(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "text/event-stream" {
			w.Write([]byte(`{"id":"plain"}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(": heartbeat\n\nevent: progress\ndata: {\"line\":\"creating sandbox eos-1\"}\n\n"))
		w.Write([]byte("event: progress\ndata: {\"line\":\"sandbox eos-1 ready\"}\n\n"))
		if strings.HasSuffix(r.URL.Path, "/fail") {
			w.Write([]byte("event: result\ndata: {\"error\":{\"kind\":\"operation_failed\",\"message\":\"boom\"}}\n\n"))
			return
		}
		w.Write([]byte("event: result\ndata: {\"id\":\"eos-1\"}\n\n"))
	}))
	defer srv.Close()
	cl := New(srv.URL, "tok")
	var msgs []string
	out, err := cl.CallProgress(context.Background(), "create_sandbox", jsonl.SystemScope(), nil, "", func(m string) { msgs = append(msgs, m) })
	if err != nil || string(out) != `{"id":"eos-1"}` {
		t.Fatalf("%s %v", out, err)
	}
	if got := strings.Join(msgs, "|"); got != "creating sandbox eos-1|sandbox eos-1 ready" {
		t.Fatalf("progress %q", got)
	}
	_, err = cl.CallProgress(context.Background(), "fail", jsonl.SystemScope(), nil, "", func(string) {})
	if ae, ok := err.(*api.Error); !ok || ae.Kind != api.KindOperationFailed {
		t.Fatalf("fail: %v", err)
	}
	out, err = cl.Call(context.Background(), "create_sandbox", jsonl.SystemScope(), nil, "")
	if err != nil || string(out) != `{"id":"plain"}` {
		t.Fatalf("plain: %s %v", out, err)
	}
}
