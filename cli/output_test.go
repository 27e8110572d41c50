package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// listGateway answers every request with a sandboxes list, preceded by
// progress frames when the request asks for them; it records the requests.
func listGateway(t *testing.T, reqs chan<- jsonl.Request) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			line, _ := jsonl.ReadLine(c, jsonl.MaxLine)
			req, _ := jsonl.DecodeRequest(line)
			if req != nil {
				reqs <- *req
				if req.StreamLogs {
					c.Write([]byte("cli_log(\"creating sandbox eos-1\")\ncli_log(\"sandbox eos-1 ready\")\n"))
				}
			}
			c.Write([]byte(`{"sandboxes":[{"id":"eos-1","state":"ready","image":"alpine"},{"id":"eos-22","state":"creating","image":null}]}` + "\n"))
			c.Close()
		}
	}()
	return l.Addr().String()
}

const listLine = `{"sandboxes":[{"id":"eos-1","state":"ready","image":"alpine"},{"id":"eos-22","state":"creating","image":null}]}` + "\n"

func withTerminal(t *testing.T, f func(io.Writer) bool) {
	old := isTerminal
	isTerminal = f
	t.Cleanup(func() { isTerminal = old })
}

func TestNonTerminalOutputUnchanged(t *testing.T) {
	isolate(t)
	reqs := make(chan jsonl.Request, 10)
	addr := listGateway(t, reqs)
	code, out, errb := run("management", "--gateway-endpoint", addr, "--gateway-auth-token", "t", "list_sandboxes")
	if code != 0 || out != listLine || errb != "" {
		t.Fatalf("%d %q %q", code, out, errb)
	}
	if r := <-reqs; r.StreamLogs {
		t.Fatal("_stream_logs sent without --progress")
	}
	// --progress on create_sandbox: frames on stderr one line each, stdout unchanged.
	code, out, errb = run("management", "--gateway-endpoint", addr, "--gateway-auth-token", "t", "--progress",
		"create_sandbox", "--image", "alpine", "--workspace-root", "/tmp")
	if code != 0 || out != listLine || errb != "creating sandbox eos-1\nsandbox eos-1 ready\n" {
		t.Fatalf("%d %q %q", code, out, errb)
	}
	if r := <-reqs; !r.StreamLogs {
		t.Fatal("--progress did not send _stream_logs")
	}
	// Without --progress nothing changes.
	code, out, errb = run("management", "--gateway-endpoint", addr, "--gateway-auth-token", "t",
		"create_sandbox", "--image", "alpine", "--workspace-root", "/tmp")
	if code != 0 || out != listLine || errb != "" {
		t.Fatalf("%d %q %q", code, out, errb)
	}
	if r := <-reqs; r.StreamLogs {
		t.Fatal("_stream_logs sent without --progress")
	}
}

func TestTerminalTableAndProgressLine(t *testing.T) {
	isolate(t)
	withTerminal(t, func(io.Writer) bool { return true })
	reqs := make(chan jsonl.Request, 10)
	addr := listGateway(t, reqs)
	code, out, _ := run("management", "--gateway-endpoint", addr, "--gateway-auth-token", "t", "list_sandboxes")
	want := "ID      STATE     IMAGE\neos-1   ready     alpine\neos-22  creating  -\n"
	if code != 0 || out != want {
		t.Fatalf("%d\n%s", code, out)
	}
	code, out, _ = run("management", "--gateway-endpoint", addr, "--gateway-auth-token", "t", "--json", "list_sandboxes")
	if code != 0 || out != listLine {
		t.Fatalf("--json: %d %q", code, out)
	}
	code, _, errb := run("management", "--gateway-endpoint", addr, "--gateway-auth-token", "t", "--progress",
		"create_sandbox", "--image", "alpine", "--workspace-root", "/tmp")
	if code != 0 || errb != "\r\033[Kcreating sandbox eos-1\r\033[Ksandbox eos-1 ready\n" {
		t.Fatalf("%d %q", code, errb)
	}
}

func TestRenderTable(t *testing.T) {
	var b bytes.Buffer
	_, rows, rest, ok := listResult([]byte(`{"entries":[{"size":12,"name":"a.txt","kind":"file"},{"name":"dir\nx","kind":"directory","extra":{"k":[1,2]}}],"path":"/workspace","truncated":false}`))
	if !ok {
		t.Fatal("not a list")
	}
	renderTable(&b, "entries", rows, rest)
	want := "" +
		"NAME   KIND       EXTRA        SIZE\n" +
		"a.txt  file       -            12\n" +
		"dir x  directory  {\"k\":[1,2]}  -\n" +
		"path: /workspace\n" +
		"truncated: false\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}

	b.Reset()
	renderTable(&b, "workspace_sessions", nil, map[string]any{})
	if b.String() != "no workspace sessions\n" {
		t.Fatalf("%q", b.String())
	}

	b.Reset()
	renderTable(&b, "matches", []any{"x", json.Number("3"), strings.Repeat("y", 100)}, nil)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 4 || lines[0] != "VALUE" || lines[2] != "3" || len([]rune(lines[3])) != maxCell {
		t.Fatalf("%q", b.String())
	}

	for _, raw := range []string{`{"sandboxes":{}}`, `[1]`, `{"id":"x"}`} {
		if _, _, _, ok := listResult([]byte(raw)); ok {
			t.Fatalf("%s: taken for a list", raw)
		}
	}
}
