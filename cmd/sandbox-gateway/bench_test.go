package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// benchSamples is the number of timed calls per operation and path.
const benchSamples = 200

// BenchmarkGatewayOverhead measures, against one ready sandbox and in the
// same run, the latency of file_read (4 KiB) and exec_command "true" through
// (a) HTTP POST /v1/ops/<op>, (b) the JSON-lines protocol (one connection per
// request, as the seed's clients do) and (c) the sandbox daemon directly
// (POST /rpc/<op> with the derived daemon token). The difference between
// (a)/(b) and (c) is the gateway's overhead.
func BenchmarkGatewayOverhead(b *testing.B) {
	g := startGatewayProcess(b)
	ws := b.TempDir()
	writeFile(b, filepath.Join(ws, "seed.txt"), "x\n")

	call := func(op string, body map[string]any) map[string]any {
		b.Helper()
		st, raw, err := g.HTTPOp(op, body)
		if err != nil || st != http.StatusOK {
			b.Fatalf("%s: %d %s %v", op, st, raw, err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			b.Fatal(err)
		}
		return m
	}
	sys := map[string]any{"kind": "system"}
	rec := call("create_sandbox", map[string]any{"scope": sys, "args": map[string]any{"image": testenv.Images[0], "workspace_root": ws}})
	id, _ := rec["id"].(string)
	b.Cleanup(func() { removeSandboxObjects(b, id) })
	defer call("destroy_sandbox", map[string]any{"scope": sys, "args": map[string]any{"sandbox_id": id}})
	scope := map[string]any{"kind": "sandbox", "sandbox_id": id}
	content := strings.Repeat(strings.Repeat("y", 63)+"\n", 64) // 4 KiB
	call("file_write", map[string]any{"scope": scope, "args": map[string]any{"path": "bench.txt", "content": content}})
	dm, _ := rec["daemon"].(map[string]any)
	host, _ := dm["host"].(string)
	if host == "" {
		host = "127.0.0.1"
	}
	daemonURL := fmt.Sprintf("http://%s:%v/rpc/", host, dm["port"])
	secret, err := os.ReadFile(filepath.Join(g.StateDir, "gateway.secret"))
	if err != nil {
		b.Fatal(err)
	}
	dtok := daemonclient.Token(bytes.TrimSpace(secret), id)

	ops := []struct {
		name string
		op   string
		args map[string]any
		ok   func([]byte) bool
	}{
		{"file_read", "file_read", map[string]any{"path": "bench.txt"}, func(r []byte) bool { return bytes.Contains(r, []byte(`"bytes_read":4096`)) }},
		{"exec_true", "exec_command", map[string]any{"cmd": "true"}, func(r []byte) bool { return bytes.Contains(r, []byte(`"status":"ok"`)) }},
	}
	paths := []struct {
		name string
		do   func(op string, args map[string]any) ([]byte, error)
	}{
		{"http", func(op string, args map[string]any) ([]byte, error) {
			_, raw, err := g.HTTPOp(op, map[string]any{"scope": scope, "args": args})
			return raw, err
		}},
		{"jsonl", func(op string, args map[string]any) ([]byte, error) {
			return testenv.RawLine(g.Addr, map[string]any{"op": op, "scope": scope, "args": args, "_sandbox_gateway_auth_token": g.Token})
		}},
		{"daemon", func(op string, args map[string]any) ([]byte, error) {
			req, err := http.NewRequest(http.MethodPost, daemonURL+op, bytes.NewReader([]byte(mustJSON(args))))
			if err != nil {
				return nil, err
			}
			req.Header.Set("Authorization", "Bearer "+dtok)
			req.Header.Set("Content-Type", "application/json")
			resp, err := testenv.HTTPClient.Do(req)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			return io.ReadAll(resp.Body)
		}},
	}

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var report []string
		for _, o := range ops {
			// Warm up every path (connections, caches), then interleave the
			// paths sample by sample so drift and background load hit all
			// three alike.
			for _, p := range paths {
				for w := 0; w < 5; w++ {
					if raw, err := p.do(o.op, o.args); err != nil || !o.ok(raw) {
						b.Fatalf("%s via %s: %s %v", o.name, p.name, raw, err)
					}
				}
			}
			d := make([][]time.Duration, len(paths))
			for s := 0; s < benchSamples; s++ {
				for k, p := range paths {
					t0 := time.Now()
					raw, err := p.do(o.op, o.args)
					d[k] = append(d[k], time.Since(t0))
					if err != nil || !o.ok(raw) {
						b.Fatalf("%s via %s: %s %v", o.name, p.name, raw, err)
					}
				}
			}
			p50s := map[string]float64{}
			for k, p := range paths {
				p50, p95 := percentile(d[k], 50), percentile(d[k], 95)
				p50s[p.name] = p50
				b.ReportMetric(p50, o.name+"-"+p.name+"-p50-ms")
				b.ReportMetric(p95, o.name+"-"+p.name+"-p95-ms")
				report = append(report, fmt.Sprintf("%-10s %-7s p50 %8.3f ms  p95 %8.3f ms", o.name, p.name, p50, p95))
			}
			b.ReportMetric(p50s["http"]-p50s["daemon"], o.name+"-http-overhead-p50-ms")
			b.ReportMetric(p50s["jsonl"]-p50s["daemon"], o.name+"-jsonl-overhead-p50-ms")
		}
		b.Logf("%d samples per cell\n%s", benchSamples, strings.Join(report, "\n"))
	}
}

// percentile returns the nearest-rank percentile of d in milliseconds.
func percentile(d []time.Duration, pct int) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := (len(s)*pct + 99) / 100
	if k < 1 {
		k = 1
	}
	return float64(s[k-1].Microseconds()) / 1000
}
