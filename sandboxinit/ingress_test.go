package sandboxinit

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// A listen address without a usable port writes no ingress table (the
// port is what it lets in) and says why, for the daemon view.
func TestIngressGuardNeedsAPort(t *testing.T) {
	for _, listen := range []string{"", "7001", ":0", ":no-such-service", "[::]:70001", "host:-1"} {
		st := guardIngress(listen, slog.New(slog.DiscardHandler))
		require.Equal(t, "unavailable", st["state"], listen)
		require.Contains(t, st["error"], "has no port", listen)
	}
}
