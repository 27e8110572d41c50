package telemetry

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// forwardLines is the obvious reading reverseLines must agree with.
func forwardLines(data []byte, maxLine int) (lines []string, skipped int) {
	for _, l := range bytes.Split(data, []byte("\n")) {
		switch {
		case len(l) == 0:
		case len(l) > maxLine:
			skipped++
		default:
			lines = append(lines, string(l))
		}
	}
	for i, j := 0, len(lines)-1; i < j; i, j = i+1, j-1 {
		lines[i], lines[j] = lines[j], lines[i]
	}
	return lines, skipped
}

func checkReverse(t *testing.T, data []byte, maxLine int) {
	t.Helper()
	var got []string
	skipped, err := reverseLines(bytes.NewReader(data), int64(len(data)), maxLine, func(l []byte) bool {
		got = append(got, string(l))
		return true
	})
	require.NoError(t, err)
	want, wantSkipped := forwardLines(data, maxLine)
	require.Equal(t, want, got)
	require.Equal(t, wantSkipped, skipped)
}

func TestReverseLines(t *testing.T) {
	long := strings.Repeat("a", chunkBytes+100)
	for _, tc := range []string{
		"", "\n", "a", "a\n", "a\nb\n", "\n\na\n\nb", "x\n" + long + "\ny\n",
		strings.Repeat("0123456789\n", 10000),
		strings.Repeat("z", chunkBytes-1) + "\n" + strings.Repeat("w", 3) + "\n",
		strings.Repeat("q", 3*chunkBytes) + "\nend\n",
	} {
		checkReverse(t, []byte(tc), MaxLineBytes)
		checkReverse(t, []byte(tc), 5)
	}
	// Stopping early stops.
	n := 0
	_, err := reverseLines(strings.NewReader("a\nb\nc\n"), 6, 10, func([]byte) bool { n++; return n < 2 })
	require.NoError(t, err)
	require.Equal(t, 2, n)
}
