// Package jsonl is the seed's JSON-lines protocol: one request object per
// connection, terminated by a newline, answered by exactly one line.
package jsonl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// MaxLine is the request and response line cap (16 MiB).
const MaxLine = 16 << 20

// Transport fields of the envelope.
const (
	TokenField      = "_sandbox_gateway_auth_token"
	StreamLogsField = "_stream_logs"
)

// Scope selects the system or one sandbox.
type Scope struct {
	Kind      string `json:"kind"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// SystemScope and SandboxScope build scopes.
func SystemScope() Scope           { return Scope{Kind: api.ScopeSystem} }
func SandboxScope(id string) Scope { return Scope{Kind: api.ScopeSandbox, SandboxID: id} }

// Request is one request line.
type Request struct {
	Op         string         `json:"op"`
	RequestID  string         `json:"request_id,omitempty"`
	Scope      Scope          `json:"scope"`
	Args       map[string]any `json:"args"`
	Token      string         `json:"_sandbox_gateway_auth_token,omitempty"`
	StreamLogs bool           `json:"_stream_logs,omitempty"`
}

// ErrTooLarge is returned by ReadLine when the line exceeds the cap.
var ErrTooLarge = errors.New("line exceeds the size limit")

// ReadLine reads one line (without the newline) of at most max bytes. EOF
// without a newline ends the line (the client half-closed).
func ReadLine(r io.Reader, max int) ([]byte, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf bytes.Buffer
	for {
		chunk, err := br.ReadSlice('\n')
		if buf.Len()+len(chunk) > max+1 {
			return nil, ErrTooLarge
		}
		buf.Write(chunk)
		if err == nil {
			return bytes.TrimRight(buf.Bytes(), "\r\n"), nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && buf.Len() > 0 {
			return buf.Bytes(), nil
		}
		return nil, err
	}
}

// DecodeRequest parses a request line: one JSON object of the envelope's
// fields and nothing after it (a misspelled "arg" would otherwise run the
// op on its defaults); errors are bad_json.
func DecodeRequest(line []byte) (*Request, *api.Error) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, api.Errorf(api.KindBadJSON, nil, "bad request json: %v (the envelope is {\"op\", \"request_id\", \"scope\", \"args\"})", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, api.Errorf(api.KindBadJSON, nil, "bad request json: more after the request object")
	}
	if req.Args == nil {
		req.Args = map[string]any{}
	}
	return &req, nil // a scope without a kind gets the op's (Operation.ScopeOf)
}

// EncodeLine marshals v as one line with a trailing newline.
func EncodeLine(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(api.Envelope{Error: api.Errorf(api.KindInternal, nil, "encode response: %v", err)})
	}
	return append(b, '\n')
}

// ParseResponse turns a response line into a result or an *api.Error.
func ParseResponse(line []byte) (json.RawMessage, error) {
	var env struct {
		Error *api.Error `json:"error"`
	}
	if err := json.Unmarshal(line, &env); err != nil {
		return nil, api.Errorf("protocol_error", nil, "bad response json: %v", err)
	}
	if env.Error != nil {
		if env.Error.Details == nil {
			env.Error.Details = map[string]any{}
		}
		return nil, env.Error
	}
	return json.RawMessage(bytes.TrimSpace(line)), nil
}
