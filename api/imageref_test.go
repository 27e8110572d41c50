package api

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckImageRef(t *testing.T) {
	for _, ok := range []string{"eos-test-busybox:1", "busybox", "registry.local:5000/team/app:v1.2",
		"app@sha256:" + strings.Repeat("a", 64), strings.Repeat("b", 64), "sha256:" + strings.Repeat("c", 64), "c2ae155d9a56"} {
		require.NoError(t, CheckImageRef(ok), ok)
	}
	for _, bad := range []string{"", "Bad::Name", "../etc", "a b", "name:tag:tag", "x@sha256:short",
		strings.Repeat("a", 600), "busybox\n", "\x00"} {
		err := CheckImageRef(bad)
		require.Error(t, err, "%q", bad)
		require.Equal(t, KindInvalidRequest, AsError(err).Kind)
		require.Equal(t, "image", AsError(err).Details["arg"])
	}
}
