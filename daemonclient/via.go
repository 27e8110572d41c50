package daemonclient

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Via is the forwarder of a sandbox's host (hostlink): the address the
// host's worker advertises and the SHA-256 fingerprint (hex) of its TLS
// certificate, published in the host's heartbeat through Temporal. The
// client pins the fingerprint; the forwarder checks the call's
// per-sandbox token and forwards only to its own host's sandboxes.
type Via struct {
	Addr        string `json:"addr"`
	Fingerprint string `json:"fingerprint"`
}

// ViaPrefix is the forwarder's route: ViaPrefix + sandbox id + the
// daemon's own path (/rpc/<op>, /health, ...).
const ViaPrefix = "/v1/daemon/"

// StatePrefix is the forwarder's route to the copy of a sandbox's state
// that its workflow left in the host's worker: StatePrefix + sandbox id +
// ?run_id=&history_length= (MirroredState).
const StatePrefix = "/v1/state/"

// MirroredState asks the forwarder via for the copy of sandbox id's state
// that the sandbox workflow's run runID left in that host's worker, if it
// has seen every event of a history historyLen long (false: the worker
// holds none that new).
func (c *Client) MirroredState(ctx context.Context, via *Via, sandboxID, runID string, historyLen int64) (json.RawMessage, bool, error) {
	base, err := c.viaBase(via, sandboxID)
	if err != nil {
		return nil, false, err
	}
	u := strings.Replace(base, ViaPrefix, StatePrefix, 1) + "?" + url.Values{"run_id": {runID}, "history_length": {strconv.FormatInt(historyLen, 10)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token(sandboxID))
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	switch {
	case err != nil:
		return nil, false, err
	case resp.StatusCode == http.StatusNoContent:
		return nil, false, nil
	case resp.StatusCode != http.StatusOK:
		return nil, false, Failure("state", resp.StatusCode, raw)
	case len(raw) > MaxResponse || !json.Valid(raw):
		return nil, false, api.Errorf(api.KindInternal, map[string]any{"via": via.Addr}, "the state copy from %s is not a JSON answer", via.Addr)
	}
	return raw, true, nil
}

// HeaderForward marks an answer of the forwarder itself (not of the
// daemon behind it); ForwardRefused says the daemon refused the
// forwarder's connection — as a refused dial, the request never reached
// it; ForwardFailed marks the forwarder's other error answers (it could
// not look the sandbox up, refused the token, or the daemon's answer broke
// off).
const (
	HeaderForward  = "X-Eos-Hostlink"
	ForwardRefused = "refused"
	ForwardFailed  = "error"
)

// ForwarderError is an error answer of a forwarder itself, not of the
// daemon behind it (HeaderForward: ForwardFailed). It unwraps to the
// forwarder's *api.Error, which callers show as they show the daemon's.
type ForwarderError struct{ Err *api.Error }

func (e *ForwarderError) Error() string { return e.Err.Error() }
func (e *ForwarderError) Unwrap() error { return e.Err }

// Fingerprint is the pin of a certificate: hex SHA-256 of its DER.
func Fingerprint(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

type forwardRefused struct{ addr string }

// IsForwardRefused reports whether err is a forwarder's answer that its
// daemon refused the connection (the forwarder itself was reached).
func IsForwardRefused(err error) bool {
	var fr *forwardRefused
	return errors.As(err, &fr)
}

func (e *forwardRefused) Error() string {
	return "the forwarder at " + e.addr + " could not connect to the daemon"
}

// pins maps a forwarder address to its certificate's fingerprint.
type pins struct {
	mu sync.Mutex
	m  map[string]string
}

// set pins fp for addr and reports whether that changed the pin.
func (p *pins) set(addr, fp string) bool {
	fp = strings.ToLower(fp)
	p.mu.Lock()
	defer p.mu.Unlock()
	old, ok := p.m[addr]
	p.m[addr] = fp
	return ok && old != fp
}

func (p *pins) get(addr string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[addr]
}

// dialTLS dials a forwarder and accepts its certificate only when its
// fingerprint is the one pinned for that address (no CA is involved: the
// pin came through Temporal, which authenticated the host's worker).
func (p *pins) dialTLS(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		want := p.get(addr)
		if want == "" {
			return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("no pinned certificate for forwarder %s", addr)}
		}
		cfg := PinnedTLS(want)
		conn, err := (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, network, addr)
		if err != nil {
			var op *net.OpError
			if errors.As(err, &op) {
				return nil, err
			}
			// A handshake that failed (wrong pin) is a dial that failed.
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		return conn, nil
	}
}

// PinnedTLS is a client TLS config that accepts exactly the certificate
// whose fingerprint is fp.
func PinnedTLS(fp string) *tls.Config {
	fp = strings.ToLower(fp)
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is not verified against a CA; VerifyConnection checks
		// the pin instead, which is stricter.
		InsecureSkipVerify: true, //nolint:gosec // pinned below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the forwarder presented no certificate")
			}
			got := Fingerprint(cs.PeerCertificates[0].Raw)
			if subtle.ConstantTimeCompare([]byte(got), []byte(fp)) != 1 {
				return fmt.Errorf("the forwarder's certificate %s is not the pinned %s", got, fp)
			}
			return nil
		},
	}
}

// viaBase is the base URL of a sandbox's daemon behind a forwarder, and
// pins the forwarder's certificate for the dial.
func (c *Client) viaBase(v *Via, sandboxID string) (string, error) {
	host, port, err := net.SplitHostPort(v.Addr)
	if err != nil || host == "" || port == "" {
		return "", api.Errorf(api.KindInvalidRequest, map[string]any{"via": v.Addr}, "invalid forwarder address %q", v.Addr)
	}
	if len(v.Fingerprint) != 64 {
		return "", api.Errorf(api.KindInvalidRequest, map[string]any{"via": v.Addr}, "forwarder %s has no valid certificate fingerprint", v.Addr)
	}
	if c.pins == nil {
		return "", api.Errorf(api.KindInternal, nil, "this daemon client cannot reach forwarders")
	}
	if c.pins.set(v.Addr, v.Fingerprint) {
		// Kept-alive connections were verified against the old pin.
		c.http.CloseIdleConnections()
	}
	return "https://" + v.Addr + ViaPrefix + sandboxID, nil
}

// roundTrip sends req; a forwarder's answer that its daemon refused the
// connection comes back as the refused dial it stands for.
func (c *Client) roundTrip(req *http.Request) (*http.Response, error) {
	began := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	record(req, time.Since(began), resp.Header)
	if resp.StatusCode == http.StatusBadGateway && resp.Header.Get(HeaderForward) == ForwardRefused {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		return nil, &forwardRefused{addr: req.URL.Host}
	}
	return resp, nil
}
