// Package client is a small Go client of the gateway: the seed's JSON-lines
// protocol over TCP or a unix socket, or HTTP (POST /v1/ops/<op>).
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// DefaultEndpoint is the gateway's default address.
const DefaultEndpoint = "127.0.0.1:7878"

// Client-local error kinds.
const (
	KindConnection = "connection_error"
	KindProtocol   = "protocol_error"
)

// Client talks to one gateway.
type Client struct {
	// Endpoint: host:port, tcp://host:port, unix:///path (JSON lines), or
	// http://host:port (HTTP).
	Endpoint string
	Token    string
	HTTP     *http.Client // for http:// endpoints; nil = a default client
}

// New returns a client for endpoint ("" = DefaultEndpoint).
func New(endpoint, token string) *Client {
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	return &Client{Endpoint: endpoint, Token: token}
}

// NewRequestID returns a fresh random request id (UUIDv4 form).
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Call runs one operation. Server errors are *api.Error with the server's
// kind; transport failures are *api.Error of kind connection_error or
// protocol_error.
func (c *Client) Call(ctx context.Context, op string, scope jsonl.Scope, args map[string]any, requestID string) (json.RawMessage, error) {
	return c.CallProgress(ctx, op, scope, args, requestID, nil)
}

// CallProgress is Call with progress streaming: when progress is not nil the
// request asks for progress (_stream_logs on JSON lines, an event stream on
// HTTP) and each progress message reaches progress before the result.
func (c *Client) CallProgress(ctx context.Context, op string, scope jsonl.Scope, args map[string]any, requestID string, progress func(msg string)) (json.RawMessage, error) {
	if requestID == "" {
		requestID = NewRequestID()
	}
	if args == nil {
		args = map[string]any{}
	}
	req := jsonl.Request{Op: op, RequestID: requestID, Scope: scope, Args: args, Token: c.Token, StreamLogs: progress != nil}
	if strings.HasPrefix(c.Endpoint, "http://") || strings.HasPrefix(c.Endpoint, "https://") {
		return c.callHTTP(ctx, req, progress)
	}
	return c.callLine(ctx, req, progress)
}

func connErr(format string, a ...any) error { return api.Errorf(KindConnection, nil, format, a...) }

// dialTarget parses the endpoint into a network and address.
func dialTarget(ep string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(ep, "unix://"):
		return "unix", strings.TrimPrefix(ep, "unix://"), nil
	case strings.HasPrefix(ep, "tcp://"):
		return "tcp", strings.TrimPrefix(ep, "tcp://"), nil
	case strings.HasPrefix(ep, "/"):
		return "unix", ep, nil
	case strings.Contains(ep, "://"):
		return "", "", fmt.Errorf("unsupported endpoint scheme: %s", ep)
	}
	return "tcp", ep, nil
}

func (c *Client) callLine(ctx context.Context, req jsonl.Request, progress func(string)) (json.RawMessage, error) {
	network, addr, err := dialTarget(c.Endpoint)
	if err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "%v", err)
	}
	line := jsonl.EncodeLine(req)
	if len(line) > jsonl.MaxLine {
		return nil, api.Errorf(api.KindRequestTooLarge, nil, "request exceeds %d bytes", jsonl.MaxLine)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, connErr("connect to gateway %s: %v", c.Endpoint, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(line); err != nil {
		return nil, connErr("write request: %v", err)
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	// ReadLine reuses br (it is large enough), so lines are not lost
	// between calls.
	br := bufio.NewReaderSize(conn, 64<<10)
	for {
		resp, err := jsonl.ReadLine(br, jsonl.MaxLine)
		if err != nil {
			if err == jsonl.ErrTooLarge {
				return nil, api.Errorf(KindProtocol, nil, "response exceeds %d bytes", jsonl.MaxLine)
			}
			return nil, connErr("read response: %v", err)
		}
		if msg, ok := ParseCLILog(resp); ok {
			if progress != nil {
				progress(msg)
			}
			continue
		}
		return jsonl.ParseResponse(resp)
	}
}

// ParseCLILog returns the message of a cli_log("<json string>") progress
// frame.
func ParseCLILog(line []byte) (string, bool) {
	inner, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("cli_log("))
	if !ok {
		return "", false
	}
	inner, ok = bytes.CutSuffix(inner, []byte(")"))
	if !ok {
		return "", false
	}
	var msg string
	if json.Unmarshal(inner, &msg) != nil {
		return "", false
	}
	return msg, true
}

func (c *Client) callHTTP(ctx context.Context, req jsonl.Request, progress func(string)) (json.RawMessage, error) {
	body, _ := json.Marshal(map[string]any{"request_id": req.RequestID, "scope": req.Scope, "args": req.Args})
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.Endpoint, "/")+"/v1/ops/"+req.Op, bytes.NewReader(body))
	if err != nil {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "%v", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("X-Request-Id", req.RequestID)
	if progress != nil {
		hr.Header.Set("Accept", "text/event-stream")
	}
	if c.Token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(hr)
	if err != nil {
		return nil, connErr("gateway %s: %v", c.Endpoint, err)
	}
	defer resp.Body.Close()
	if progress != nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return readSSEResult(resp.Body, progress)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, jsonl.MaxLine+1))
	if err != nil {
		return nil, connErr("read response: %v", err)
	}
	if len(b) > jsonl.MaxLine {
		return nil, api.Errorf(KindProtocol, nil, "response exceeds %d bytes", jsonl.MaxLine)
	}
	out, err := jsonl.ParseResponse(b)
	if err == nil && resp.StatusCode >= 400 {
		return nil, api.Errorf(KindProtocol, map[string]any{"status": resp.StatusCode}, "HTTP %d without an error envelope", resp.StatusCode)
	}
	return out, err
}

// readSSEResult reads `event: progress` frames (data {"line": msg}) and
// returns the `event: result` body.
func readSSEResult(r io.Reader, progress func(string)) (json.RawMessage, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var name string
	var data bytes.Buffer
	for {
		line, err := jsonl.ReadLine(br, jsonl.MaxLine)
		if err != nil && !errors.Is(err, io.EOF) {
			if err == jsonl.ErrTooLarge {
				return nil, api.Errorf(KindProtocol, nil, "response exceeds %d bytes", jsonl.MaxLine)
			}
			return nil, connErr("read response: %v", err)
		}
		if err != nil {
			return nil, api.Errorf(KindProtocol, nil, "event stream ended without a result")
		}
		switch {
		case len(line) == 0:
			switch name {
			case "progress":
				var d struct {
					Line string `json:"line"`
				}
				if json.Unmarshal(data.Bytes(), &d) == nil {
					progress(d.Line)
				}
			case "result":
				return jsonl.ParseResponse(data.Bytes())
			}
			name = ""
			data.Reset()
		case bytes.HasPrefix(line, []byte("event:")):
			name = string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(bytes.TrimPrefix(line[len("data:"):], []byte(" ")))
			if data.Len() > jsonl.MaxLine {
				return nil, api.Errorf(KindProtocol, nil, "response exceeds %d bytes", jsonl.MaxLine)
			}
		}
	}
}

// EndpointFromEnv returns SANDBOX_GATEWAY_SOCKET or the default.
func EndpointFromEnv() string {
	if e := os.Getenv("SANDBOX_GATEWAY_SOCKET"); e != "" {
		return e
	}
	return DefaultEndpoint
}
