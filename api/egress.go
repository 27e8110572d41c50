package api

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Egress modes of an isolated session.
const (
	EgressDefault = "default" // the sandbox and what it reaches, never other sessions' namespaces
	EgressNone    = "none"    // nothing beyond the session's own namespace
	EgressAllow   = "allow"   // only Allow's cidr:port entries
)

// MaxEgressRules caps an allow-list.
const MaxEgressRules = 64

// Egress is a session's egress policy. On the wire it is "default", "none"
// or an array of "cidr:port" strings (an address without a prefix length is
// a /32; the port is TCP and UDP).
type Egress struct {
	Mode  string
	Allow []string // Mode EgressAllow only, as given
}

// MarshalJSON writes the wire form.
func (e Egress) MarshalJSON() ([]byte, error) {
	if e.Mode == EgressAllow {
		return json.Marshal(append([]string{}, e.Allow...))
	}
	if e.Mode == "" {
		return json.Marshal(EgressDefault)
	}
	return json.Marshal(e.Mode)
}

// UnmarshalJSON reads the wire form; Validate checks the entries.
func (e *Egress) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s != EgressDefault && s != EgressNone {
			return fmt.Errorf("egress must be %q, %q or an array of \"cidr:port\", not %q", EgressDefault, EgressNone, s)
		}
		*e = Egress{Mode: s}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("egress must be %q, %q or an array of \"cidr:port\" strings", EgressDefault, EgressNone)
	}
	*e = Egress{Mode: EgressAllow, Allow: list}
	return nil
}

// EgressRule is one parsed allow-list entry.
type EgressRule struct {
	Prefix netip.Prefix // IPv4
	Port   uint16
}

func (r EgressRule) String() string { return r.Prefix.String() + ":" + strconv.Itoa(int(r.Port)) }

// Rules validates the policy and returns its allow-list parsed (nil for
// default and none). Errors are invalid_request.
func (e Egress) Rules() ([]EgressRule, error) {
	switch e.Mode {
	case "", EgressDefault, EgressNone:
		return nil, nil
	case EgressAllow:
	default:
		return nil, Errorf(KindInvalidRequest, map[string]any{"arg": "egress"}, "egress mode %q is unknown", e.Mode)
	}
	if len(e.Allow) > MaxEgressRules {
		return nil, Errorf(KindInvalidRequest, map[string]any{"arg": "egress", "max": MaxEgressRules}, "egress has %d entries, at most %d are allowed", len(e.Allow), MaxEgressRules)
	}
	rules := make([]EgressRule, 0, len(e.Allow))
	for _, s := range e.Allow {
		r, err := ParseEgressRule(s)
		if err != nil {
			return nil, Errorf(KindInvalidRequest, map[string]any{"arg": "egress", "entry": s}, "egress entry %q: %v", s, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// ParseEgressRule parses "cidr:port" (IPv4; "10.0.0.0/8:443", "1.2.3.4:53").
func ParseEgressRule(s string) (EgressRule, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return EgressRule{}, fmt.Errorf("want cidr:port")
	}
	port, err := strconv.ParseUint(s[i+1:], 10, 16)
	if err != nil || port == 0 {
		return EgressRule{}, fmt.Errorf("port %q is not 1-65535", s[i+1:])
	}
	addr := s[:i]
	var p netip.Prefix
	if strings.Contains(addr, "/") {
		p, err = netip.ParsePrefix(addr)
	} else {
		var a netip.Addr
		a, err = netip.ParseAddr(addr)
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if err != nil {
		return EgressRule{}, fmt.Errorf("%q is not an IPv4 address or CIDR", addr)
	}
	if !p.Addr().Is4() {
		return EgressRule{}, fmt.Errorf("%q: sessions have IPv4 only", addr)
	}
	return EgressRule{Prefix: p.Masked(), Port: uint16(port)}, nil
}
