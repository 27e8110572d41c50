package gateway

import (
	"os"
	"regexp"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// TestEveryLifecycleOpHasAHandler keeps the catalog's lifecycle operations,
// LifecycleOps, and the cases of TemporalBackend.LifecycleProgress equal, so
// no catalog operation reaches the "no lifecycle handler" default.
func TestEveryLifecycleOpHasAHandler(t *testing.T) {
	var want []string
	for _, o := range api.PublicOps("") {
		if o.Lifecycle || o.AmendWhenSessionless {
			want = append(want, o.Name)
		}
	}
	got := append([]string(nil), LifecycleOps...)
	sort.Strings(want)
	sort.Strings(got)
	require.Equal(t, want, got)

	src, err := os.ReadFile("temporal.go")
	require.NoError(t, err)
	body := regexp.MustCompile(`(?s)func \(b \*TemporalBackend\) LifecycleProgress.*?\n}\n`).Find(src)
	require.NotNil(t, body)
	cases := map[string]bool{}
	for _, c := range regexp.MustCompile(`case ([^:]+):`).FindAllSubmatch(body, -1) {
		for _, n := range regexp.MustCompile(`"([a-z_]+)"`).FindAllSubmatch(c[1], -1) {
			cases[string(n[1])] = true
		}
	}
	for _, op := range got {
		require.True(t, cases[op], "LifecycleProgress has no case for %s", op)
	}
}
