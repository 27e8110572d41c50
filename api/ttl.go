package api

import (
	"fmt"
	"strings"
	"time"
)

// Bounds of a lifecycle duration (create_sandbox ttl and
// session_idle_ttl, the gateway's defaults).
const (
	MinTTL = time.Second
	MaxTTL = 366 * 24 * time.Hour
)

// ParseTTL reads a lifecycle duration in Go syntax ("90s", "30m", "24h",
// "1h30m"). "" and "0" mean off (0). Anything else must lie within
// MinTTL..MaxTTL; a refusal is invalid_request naming the argument.
func ParseTTL(arg, s string) (time.Duration, *Error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, Errorf(KindInvalidRequest, map[string]any{"arg": arg, "value": truncateArg(s)},
			"%s: %q is not a duration; use Go syntax such as 90s, 30m, 24h or 1h30m (0 turns it off)", arg, truncateArg(s))
	}
	if err := CheckTTL(arg, d); err != nil {
		return 0, err
	}
	return d, nil
}

// CheckTTL checks a parsed lifecycle duration: 0 (off) or within
// MinTTL..MaxTTL.
func CheckTTL(arg string, d time.Duration) *Error {
	if d == 0 {
		return nil
	}
	if d < 0 {
		return Errorf(KindInvalidRequest, map[string]any{"arg": arg, "value": d.String()}, "%s must be positive, not %s (0 turns it off)", arg, d)
	}
	if d < MinTTL || d > MaxTTL {
		return Errorf(KindInvalidRequest, map[string]any{"arg": arg, "value": d.String(), "min": MinTTL.String(), "max": MaxTTL.String()},
			"%s must be between %s and %s, not %s", arg, MinTTL, fmt.Sprintf("%dh", int(MaxTTL/time.Hour)), d)
	}
	return nil
}
