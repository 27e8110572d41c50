package jsonl

import (
	"errors"
	"strings"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
)

func TestReadLine(t *testing.T) {
	for in, want := range map[string]string{"{}\n": "{}", "{}": "{}", "{\"a\":1}\r\nrest": "{\"a\":1}"} {
		got, err := ReadLine(strings.NewReader(in), 100)
		if err != nil || string(got) != want {
			t.Errorf("%q: %q %v", in, got, err)
		}
	}
	if _, err := ReadLine(strings.NewReader(strings.Repeat("x", 200)+"\n"), 100); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too large: %v", err)
	}
	if _, err := ReadLine(strings.NewReader(""), 100); err == nil {
		t.Error("empty input accepted")
	}
}

func TestDecodeAndParse(t *testing.T) {
	req, e := DecodeRequest([]byte(`{"op":"x","args":{"n":5},"_sandbox_gateway_auth_token":"t"}`))
	if e != nil || req.Op != "x" || req.Token != "t" || req.Scope.Kind != "" || req.Args["n"].(interface{ String() string }).String() != "5" {
		t.Errorf("%+v %v", req, e)
	}
	if _, e := DecodeRequest([]byte(`{"op":`)); e == nil || e.Kind != api.KindBadJSON {
		t.Errorf("bad json: %v", e)
	}
	if _, err := ParseResponse([]byte(`{"error":{"kind":"not_found","message":"m"}}`)); api.AsError(err).Kind != "not_found" || api.AsError(err).Details == nil {
		t.Errorf("%v", err)
	}
	if out, err := ParseResponse([]byte(`{"ok":1}` + "\n")); err != nil || string(out) != `{"ok":1}` {
		t.Errorf("%s %v", out, err)
	}
}

// An envelope with a field it does not have (a misspelled "arg", a scope
// key) or anything after its object is refused, not run on defaults.
func TestDecodeRequestIsStrict(t *testing.T) {
	for _, line := range []string{`{"op":"x","arg":{"egress":"none"}}`, `{"bogus":1}`, `{}{"x":1}`, `{"op":"x"} 5`,
		`{"scope":{"kind":"sandbox","sandbox_id":"s","x":1}}`} {
		if _, e := DecodeRequest([]byte(line)); e == nil || e.Kind != api.KindBadJSON {
			t.Errorf("%s: %v", line, e)
		}
	}
	for _, line := range []string{`{}`, ` {"op":"x","request_id":"r","scope":{"kind":"system"},"args":{},"_stream_logs":true} `} {
		if _, e := DecodeRequest([]byte(line)); e != nil {
			t.Errorf("%s: %v", line, e)
		}
	}
}
