package sandboxinit

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
)

// TestFileErrorKinds: a caller's mistake is invalid_request with the
// seed's wording, never internal_error.
func TestFileErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		err     error
		kind    string
		message string
	}{
		{&layerstack.NotFileError{Path: "d", Kind: layerstack.KindDirectory}, api.KindInvalidRequest, "d is a directory, not a file"},
		{&layerstack.NotFileError{Path: "link.txt", Kind: layerstack.KindSymlink}, api.KindInvalidRequest, "link.txt is a symlink, not a file"},
		{&layerstack.NotFileError{Path: "f/x", Kind: layerstack.KindFile, Parent: "f"}, api.KindInvalidRequest, "parent f of f/x is a file"},
		{layerstack.ErrNotUTF8, api.KindInvalidRequest, "file is not valid UTF-8: p"},
		{&layerstack.TooLargeError{Path: "p", Size: 9, Max: 4}, api.KindInvalidRequest, "file is too large"},
		{errors.New("disk on fire"), "", "disk on fire"},
	} {
		err := fileError("p", tc.err)
		require.Contains(t, err.Error(), tc.message)
		var ae *api.Error
		if tc.kind == "" {
			require.False(t, errors.As(err, &ae), "the daemon's own failure stays one: %v", err)
			continue
		}
		require.ErrorAs(t, err, &ae)
		require.Equal(t, tc.kind, ae.Kind, tc.message)
	}
}

// TestProtectedSessionlessWrite: the store refusing a protected path is a
// rejected publish, as the seed reports it.
func TestProtectedSessionlessWrite(t *testing.T) {
	err := amendError(&layerstack.PathError{Path: "layers/evil.txt", Reason: layerstack.ReasonProtectedPath, Detail: "store-internal name at the workspace root"})
	ae := api.AsError(err)
	require.Equal(t, api.KindOperationFailed, ae.Kind)
	rej := ae.Details["publish_rejection"].(*api.PublishRejection)
	require.Equal(t, "protected_path", rej.Reason)
	require.Equal(t, "layers/evil.txt", rej.Path)
	err = amendError(&layerstack.PathError{Path: "", Reason: layerstack.ReasonInvalidPath, Detail: "root"})
	require.Equal(t, api.KindInvalidRequest, api.AsError(err).Kind)
}

// TestExecSessionGone: a command in a session that is gone is the seed's
// operation_failed "workspace session not found: <id>".
func TestExecSessionGone(t *testing.T) {
	gone := api.Errorf(api.KindNotFound, map[string]any{"workspace_session_id": "ws-1"}, "workspace session not found: ws-1")
	err := execSessionGone("ws-1", gone)
	require.Equal(t, api.KindOperationFailed, api.AsError(err).Kind)
	require.Equal(t, "workspace session not found: ws-1", api.AsError(err).Message)
	other := api.Errorf(api.KindNotFound, nil, "file not found: x")
	require.Equal(t, other, execSessionGone("ws-1", other), "other not_found answers are kept")
	require.Equal(t, gone, execSessionGone("", gone), "an implicit session is not the caller's")
	require.NoError(t, execSessionGone("ws-1", nil))
}

// TestCallerRequestID: calls the workflow makes for a request carry its id
// as their trace and owner.
func TestCallerRequestID(t *testing.T) {
	require.Equal(t, "rid-9", callerRequestID("sandbox/eos-1/update/rid-9"))
	require.Equal(t, "sandbox/eos-1/init_base", callerRequestID("sandbox/eos-1/init_base"))
	require.Equal(t, "rid-9", callerRequestID("rid-9"))
	require.Equal(t, "sandbox/eos-1/update/", callerRequestID("sandbox/eos-1/update/"))
}

// TestForwardRoute: malformed forward routes are refused by their shape
// alone (400 before authentication); well-formed ones pass to the token
// check.
func TestForwardRoute(t *testing.T) {
	for p, ok := range map[string]bool{
		"/forward/shared/not-a-port/": false, "/forward/shared/0/": false, "/forward/shared/65536/": false, "/forward/shared": false,
		"/forward/shared/3000/": true, "/forward/isolated=missing/3000/": true, "/forward/other/3000/x": true,
	} {
		_, _, err := forwardRoute(p)
		require.Equal(t, ok, err == nil, p)
	}
}
