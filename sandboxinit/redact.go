package sandboxinit

import (
	"regexp"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// redactor keeps the daemon's own paths out of what a client is told. File
// operations and captures already name workspace paths only; this is the
// last line at the edge, for an error from deeper down (the kernel, a
// library) that carries a path: a session's upper, merged or staged dir
// becomes the workspace-relative path, any other path on the state volume
// "<state>".
type redactor struct {
	session, state *regexp.Regexp
}

func newRedactor(stateDir string) *redactor {
	q := regexp.QuoteMeta(strings.TrimSuffix(stateDir, "/"))
	return &redactor{
		session: regexp.MustCompile(q + `/sessions/[^/\s"']+/(?:upper-\d+|merged|refresh-upper)(?:/|\b)`),
		state:   regexp.MustCompile(q + `(?:/[^\s"':,]*)?(?:\b|$)`),
	}
}

func (r *redactor) text(s string) string {
	s = r.session.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasSuffix(m, "/") {
			return ""
		}
		return "."
	})
	return replaceStandalone(s, r.state, "<state>")
}

// replaceStandalone replaces re's matches in s with repl, except a match
// inside another path or word (a txid such as publish/eos-<uuid>/... is no
// path under a state dir /eos).
func replaceStandalone(s string, re *regexp.Regexp, repl string) string {
	var b strings.Builder
	last := 0
	for _, m := range re.FindAllStringIndex(s, -1) {
		i, j := m[0], m[1]
		if (i > 0 && pathByte(s[i-1])) || (j < len(s) && s[j] != '/' && pathByte(s[j])) {
			continue
		}
		b.WriteString(s[last:i])
		b.WriteString(repl)
		last = j
	}
	b.WriteString(s[last:])
	return b.String()
}

// redact returns err with the paths in its message and string details
// redacted; its kind stays (an untyped error stays internal_error).
func (r *redactor) redact(err error) error {
	if err == nil {
		return nil
	}
	e := api.AsError(err)
	msg := r.text(e.Message)
	var det map[string]any
	for k, v := range e.Details {
		s, ok := v.(string)
		if !ok || r.text(s) == s {
			continue
		}
		if det == nil {
			det = make(map[string]any, len(e.Details))
			for k2, v2 := range e.Details {
				det[k2] = v2
			}
		}
		det[k] = r.text(s)
	}
	if msg == e.Message && det == nil {
		return err
	}
	if det == nil {
		det = e.Details
	}
	return &api.Error{Kind: e.Kind, Message: msg, Details: det}
}
