package sandboxinit

import (
	"errors"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/stretchr/testify/require"
)

func TestRedactKeepsStatePathsFromClients(t *testing.T) {
	r := newRedactor("/eos")
	for in, want := range map[string]string{
		"capture /eos/sessions/ws-1a2b/upper-0/d/f.txt: no such file": "capture d/f.txt: no such file",
		"open /eos/sessions/ws-1a2b/merged: busy":                     "open .: busy",
		"read /eos/secret: permission denied":                         "read <state>: permission denied",
		"stat /eos/layers/l-1/x, and /eos":                            "stat <state>, and <state>",
		"/eosx/file stays":                                            "/eosx/file stays",
		"publish publish/eos-1f/ws-2/7 was aborted":                   "publish publish/eos-1f/ws-2/7 was aborted",
		"nothing to redact":                                           "nothing to redact",
	} {
		require.Equal(t, want, r.text(in), in)
	}
	err := r.redact(errors.New("open /eos/sessions/ws-1/upper-3/a/b: too many levels of symbolic links"))
	e := api.AsError(err)
	require.Equal(t, api.KindInternal, e.Kind)
	require.Equal(t, "open a/b: too many levels of symbolic links", e.Message)
	err = r.redact(api.Errorf(api.KindInvalidRequest, map[string]any{"path": "/eos/token", "n": 1}, "bad %s", "/eos/token"))
	e = api.AsError(err)
	require.Equal(t, api.KindInvalidRequest, e.Kind)
	require.Equal(t, "bad <state>", e.Message)
	require.Equal(t, map[string]any{"path": "<state>", "n": 1}, e.Details)
	plain := api.Errorf(api.KindNotFound, nil, "file not found: a.txt")
	require.Same(t, plain, r.redact(plain))
	require.NoError(t, r.redact(nil))
}
