package daemonclient

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// FuzzDaemonStream feeds arbitrary bytes as a streamed daemon answer: the
// reader never panics, returns a result only when a result frame came, and
// hands progress only lines the stream held.
func FuzzDaemonStream(f *testing.F) {
	for _, seed := range []string{
		`{"line":{"offset":0,"stream":"stdout","text":"a"}}` + "\n" + `{"result":{"status":"ok"}}` + "\n",
		`{"line":{"offset":0,"stream":"stderr","text":"e"}}` + "\n" + `{"error":{"kind":"not_found","message":"x"}}` + "\n",
		`{"line":null}` + "\n", "{", "\n\n", `{"result":1}`, strings.Repeat("x", 100),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var lines []string
		out, err := readStream(bytes.NewReader(b), Call{SandboxID: "s", Op: "exec_command"}, func(l api.OutputLine) { lines = append(lines, l.Text) })
		if err == nil {
			if !json.Valid(out) {
				t.Fatalf("a result that is not JSON: %q", out)
			}
			if !bytes.Contains(bytes.ToLower(b), []byte(`"result"`)) {
				t.Fatalf("a result from a stream without a result frame: %q", b)
			}
		}
		for _, l := range lines {
			if !bytes.Contains(bytes.ToLower(b), []byte(`"line"`)) {
				t.Fatalf("progress %q from a stream without line frames", l)
			}
		}
	})
}
