package mcp

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRenderFileDownload(t *testing.T) {
	small := RenderResult("file_download", map[string]any{"path": "a.bin", "size": float64(3), "sha256": "abc", "executable": false, "content_base64": "AAEC"})
	require.Equal(t, "a.bin: 3 bytes, sha256 abc, executable false\ncontent_base64: AAEC", small)
	big := RenderResult("file_download", map[string]any{"path": "b.bin", "size": float64(1 << 20), "content_base64": strings.Repeat("A", 1<<20)})
	require.Less(t, len(big), 200, "a large file's bytes are not repeated in the text")
	require.Contains(t, big, "structuredContent")
}
