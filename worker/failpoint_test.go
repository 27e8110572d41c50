package worker

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFailpointInterceptorParses(t *testing.T) {
	for _, tt := range []struct {
		env    string
		target string
		nth    int64
	}{
		{"StartContainer", "StartContainer", 1},
		{"StartContainer#2", "StartContainer", 2},
		{"CallDaemonHere:publish_workspace_session#3", "CallDaemonHere:publish_workspace_session", 3},
	} {
		t.Setenv(FailpointEnv, tt.env)
		fp, ok := FailpointInterceptor().(*failpoint)
		require.True(t, ok, tt.env)
		require.Equal(t, tt.target, fp.target, tt.env)
		require.Equal(t, tt.nth, fp.nth, tt.env)
	}
	for _, bad := range []string{"", "StartContainer#0", "StartContainer#-1", "StartContainer#x"} {
		t.Setenv(FailpointEnv, bad)
		require.Nil(t, FailpointInterceptor(), "%q arms nothing", bad)
	}
}
