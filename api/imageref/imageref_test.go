package imageref

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{"eos-test-busybox:1", "busybox", "registry.local:5000/team/app:v1.2",
		"app@sha256:" + strings.Repeat("a", 64), strings.Repeat("b", 64), "sha256:" + strings.Repeat("c", 64), "c2ae155d9a56"} {
		require.NoError(t, Check(ok), ok)
	}
	for _, bad := range []string{"", "Bad::Name", "../etc", "a b", "name:tag:tag", "x@sha256:short",
		strings.Repeat("a", 600), "busybox\n", "\x00"} {
		err := Check(bad)
		require.Error(t, err, "%q", bad)
		require.Equal(t, api.KindInvalidRequest, api.AsError(err).Kind)
		require.Equal(t, "image", api.AsError(err).Details["arg"])
	}
}
