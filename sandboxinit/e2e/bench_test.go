package e2e

// Daemon latency benchmarks, each beside its Docker baseline in the same run.
//
// Every scenario runs at concurrency 1, 5 and 20. Within one concurrency the
// daemon and its baselines run back to back, so they see the same machine
// noise. A benchmark iteration is a fixed batch of samples (not b.N
// operations): percentiles need a sample count of their own, and the
// baselines cost 40-400 ms an operation. With -benchtime 1x (make bench)
// every leaf runs one batch; with a longer benchtime the batches pool.
//
// Reported per leaf (ns/op is overridden with the mean latency of one
// operation, not of one batch):
//
//	ops/s           completed operations per second of wall time, all workers
//	p50-ms ...      latency percentiles of one operation (nearest rank)
//	samples         operations measured
//	<part>-p50-ms   a sub-duration (exec: the daemon's own wall_time_seconds
//	                and command_total_time_seconds; session: create, destroy)
//
// EOS_BENCH_SCALE (default 1) scales every sample count, for quick looks
// (0.1) or steadier tails (3). The top-level benchmark logs a summary with
// the daemon-to-baseline ratios.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchImage is the image of the sandbox and of the baseline container.
const benchImage = "eos-test-busybox:1"

var concurrencies = []int{1, 5, 20}

// content4k is 4096 bytes of text: 64 lines of 63 characters and a newline.
var content4k = func() string {
	var sb strings.Builder
	for i := 0; i < 64; i++ {
		line := fmt.Sprintf("line %02d ", i)
		sb.WriteString(line + strings.Repeat("x", 63-len(line)) + "\n")
	}
	return sb.String()
}()

// sampleCount is n scaled by EOS_BENCH_SCALE, at least 5.
func sampleCount(n int) int {
	if s, err := strconv.ParseFloat(os.Getenv("EOS_BENCH_SCALE"), 64); err == nil && s > 0 {
		n = int(math.Round(float64(n) * s))
	}
	return max(n, 5)
}

// perC picks the sample count for concurrency c from the counts for 1, 5, 20.
func perC(c, at1, at5, at20 int) int {
	switch {
	case c <= 1:
		return sampleCount(at1)
	case c <= 5:
		return sampleCount(at5)
	default:
		return sampleCount(at20)
	}
}

// ---------------------------------------------------------------------------
// Load generation and statistics

// opFunc runs one operation on worker w (0..c-1). It may store sub-durations
// in parts (one slot per name given to runLoad).
type opFunc func(w int, parts []time.Duration) error

type latStats struct {
	Samples       int
	Wall          time.Duration
	Mean          time.Duration
	P50, P95, P99 time.Duration
	OpsPerSec     float64
	PartP50       map[string]time.Duration
	PartP95       map[string]time.Duration
	Concurrency   int
}

var (
	statsMu sync.Mutex
	stats   = map[string]latStats{}
)

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// runLoad measures n operations per benchmark iteration on c workers (after
// one untimed warm-up operation per worker) and reports the metrics.
func runLoad(b *testing.B, c, n int, parts []string, op opFunc) latStats {
	b.Helper()
	var lat []time.Duration
	partLat := make([][]time.Duration, len(parts))
	var wall time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := parallel(c, func(w int) error { return op(w, make([]time.Duration, len(parts))) }); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
		batch := make([]time.Duration, n)
		batchParts := make([][]time.Duration, n)
		var next atomic.Int64
		var errMu sync.Mutex
		var firstErr error
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for w := 0; w < c; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					k := int(next.Add(1) - 1)
					if k >= n {
						return
					}
					p := make([]time.Duration, len(parts))
					t0 := time.Now()
					err := op(w, p)
					batch[k], batchParts[k] = time.Since(t0), p
					if err != nil {
						errMu.Lock()
						if firstErr == nil {
							firstErr = fmt.Errorf("operation %d on worker %d: %w", k, w, err)
						}
						errMu.Unlock()
						next.Store(int64(n))
						return
					}
				}
			}()
		}
		wg.Wait()
		wall += time.Since(start)
		b.StopTimer()
		if firstErr != nil {
			b.Fatal(firstErr)
		}
		lat = append(lat, batch...)
		for _, p := range batchParts {
			for j := range parts {
				partLat[j] = append(partLat[j], p[j])
			}
		}
	}

	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	st := latStats{Samples: len(lat), Wall: wall, Mean: sum / time.Duration(len(lat)),
		P50: percentile(lat, .50), P95: percentile(lat, .95), P99: percentile(lat, .99),
		OpsPerSec: float64(len(lat)) / wall.Seconds(), PartP50: map[string]time.Duration{}, PartP95: map[string]time.Duration{},
		Concurrency: c}
	b.ReportMetric(float64(st.Mean.Nanoseconds()), "ns/op")
	b.ReportMetric(st.OpsPerSec, "ops/s")
	b.ReportMetric(msf(st.P50), "p50-ms")
	b.ReportMetric(msf(st.P95), "p95-ms")
	b.ReportMetric(msf(st.P99), "p99-ms")
	b.ReportMetric(float64(st.Samples), "samples")
	for j, name := range parts {
		pl := partLat[j]
		sort.Slice(pl, func(i, k int) bool { return pl[i] < pl[k] })
		st.PartP50[name], st.PartP95[name] = percentile(pl, .50), percentile(pl, .95)
		b.ReportMetric(msf(st.PartP50[name]), name+"-p50-ms")
	}
	statsMu.Lock()
	stats[b.Name()] = st
	statsMu.Unlock()
	return st
}

// parallel runs f(0..c-1) concurrently and returns the first error.
func parallel(c int, f func(w int) error) error {
	errs := make([]error, c)
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[w] = f(w) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// summarize prints, for each concurrency, every daemon leaf of the
// top-level benchmark b beside its baselines: the p50 latency ratio
// (baseline p50 / daemon p50) and the throughput ratio (daemon ops/s /
// baseline ops/s). It goes to stdout because a parent benchmark's log is
// shown only with -v; no line starts with "Benchmark" or has a "key: "
// prefix, so benchstat ignores them.
func summarize(b *testing.B, pairs map[string][]string) {
	b.Helper()
	statsMu.Lock()
	defer statsMu.Unlock()
	var out strings.Builder
	fmt.Fprintf(&out, "# summary of %s (ratios = baseline p50 / daemon p50, daemon ops/s / baseline ops/s)\n", b.Name())
	fmt.Fprintf(&out, "#   %-20s %8s %8s %8s %8s\n", "leaf", "ops/s", "p50-ms", "p95-ms", "p99-ms")
	keys := make([]string, 0, len(pairs))
	for k := range pairs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, c := range concurrencies {
		for _, d := range keys {
			name := fmt.Sprintf("%s/c=%d/%s", b.Name(), c, d)
			st, ok := stats[name]
			if !ok {
				continue
			}
			fmt.Fprintf(&out, "#   %-20s %8.1f %8.2f %8.2f %8.2f", strings.TrimPrefix(name, b.Name()+"/"), st.OpsPerSec, msf(st.P50), msf(st.P95), msf(st.P99))
			for _, base := range pairs[d] {
				if bs, ok := stats[fmt.Sprintf("%s/c=%d/%s", b.Name(), c, base)]; ok {
					fmt.Fprintf(&out, "   vs %s p50 %.1fx ops/s %.1fx", base, float64(bs.P50)/float64(st.P50), st.OpsPerSec/bs.OpsPerSec)
				}
			}
			out.WriteString("\n")
		}
	}
	fmt.Print(out.String())
}

// ---------------------------------------------------------------------------
// The daemon's RPC, for concurrent use (the harness's helpers fail the test
// from the calling goroutine; these return errors).

type rpcClient struct {
	base, token string
	hc          *http.Client
}

func newHTTPClient(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
	tr := &http.Transport{Proxy: nil, MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 2 * time.Minute, DisableCompression: true}
	if dial != nil {
		tr.DialContext = dial
	} else {
		tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return &http.Client{Transport: tr, Timeout: 3 * time.Minute}
}

func newRPC(base, token string) *rpcClient {
	return &rpcClient{base: base, token: token, hc: newHTTPClient(nil)}
}

func (r *rpcClient) call(op string, args, out any) error {
	body, err := json.Marshal(args)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, r.base+"/rpc/"+op, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", op, resp.StatusCode, tail(string(raw)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s: decode %q: %w", op, tail(string(raw)), err)
	}
	return nil
}

type execResult struct {
	Status                  string  `json:"status"`
	ExitCode                *int    `json:"exit_code"`
	WallTimeSeconds         float64 `json:"wall_time_seconds"`
	CommandTotalTimeSeconds float64 `json:"command_total_time_seconds"`
	Output                  string  `json:"output"`
}

// execTrue runs `true` in session ws, yielding until it ends, and stores
// the daemon's own timings in parts[0] (wall_time_seconds: from the command
// engine's start to the response) and parts[1] (command_total_time_seconds:
// process start through exit) when parts has room.
func (r *rpcClient) execTrue(ws string, parts []time.Duration) error {
	var out execResult
	if err := r.call("exec_command", map[string]any{"cmd": "true", "workspace_session_id": ws, "yield_time_ms": 60000}, &out); err != nil {
		return err
	}
	if out.Status != "ok" || out.ExitCode == nil || *out.ExitCode != 0 {
		return fmt.Errorf("exec true: status %q exit %v output %q", out.Status, out.ExitCode, out.Output)
	}
	if len(parts) >= 2 {
		parts[0] = time.Duration(out.WallTimeSeconds * float64(time.Second))
		parts[1] = time.Duration(out.CommandTotalTimeSeconds * float64(time.Second))
	}
	return nil
}

func (r *rpcClient) readFile(ws, path string, want int) error {
	var out struct {
		Content    string `json:"content"`
		TotalBytes int    `json:"total_bytes"`
	}
	if err := r.call("file_read", map[string]any{"path": path, "workspace_session_id": ws}, &out); err != nil {
		return err
	}
	if len(out.Content) != want {
		return fmt.Errorf("file_read %s: %d bytes, want %d", path, len(out.Content), want)
	}
	return nil
}

func (r *rpcClient) writeFile(ws, path, content string) error {
	var out struct {
		BytesWritten int `json:"bytes_written"`
	}
	if err := r.call("file_write", map[string]any{"path": path, "content": content, "workspace_session_id": ws}, &out); err != nil {
		return err
	}
	if out.BytesWritten != len(content) {
		return fmt.Errorf("file_write %s: wrote %d bytes, want %d", path, out.BytesWritten, len(content))
	}
	return nil
}

func (r *rpcClient) createSession() (string, error) {
	var out struct {
		ID string `json:"workspace_session_id"`
	}
	if err := r.call("create_workspace_session", map[string]any{}, &out); err != nil {
		return "", err
	}
	if out.ID == "" {
		return "", errors.New("create_workspace_session: no id")
	}
	return out.ID, nil
}

func (r *rpcClient) destroySession(id string) error {
	var out struct {
		Destroyed bool `json:"destroyed"`
	}
	if err := r.call("destroy_workspace_session", map[string]any{"workspace_session_id": id, "force": true}, &out); err != nil {
		return err
	}
	if !out.Destroyed {
		return fmt.Errorf("destroy %s: not destroyed", id)
	}
	return nil
}

// ---------------------------------------------------------------------------
// The Docker Engine API on its unix socket (what the docker CLI calls, minus
// the CLI's own process start and configuration loading).

type engineAPI struct {
	hc   *http.Client
	base string
}

func newEngineAPI(b testing.TB) *engineAPI {
	b.Helper()
	sock := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); strings.HasPrefix(h, "unix://") {
		sock = strings.TrimPrefix(h, "unix://")
	}
	hc := newHTTPClient(func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	e := &engineAPI{hc: hc, base: "http://docker"}
	var v struct{ APIVersion string }
	if _, err := e.do(http.MethodGet, "/version", nil, &v); err != nil || v.APIVersion == "" {
		b.Fatalf("docker engine API on %s: %v (version %q)", sock, err, v.APIVersion)
	}
	e.base += "/v" + v.APIVersion
	return e
}

// do sends one request and decodes a JSON answer into out (if not nil);
// statuses >= 300 are errors.
func (e *engineAPI) do(method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.base+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// exec does what `docker exec` does: create the exec, start it attached
// (stdout and stderr streamed until it ends), inspect it for the exit code.
// It returns stdout.
func (e *engineAPI) exec(container string, cmd ...string) (string, error) {
	var created struct{ ID string }
	if _, err := e.do(http.MethodPost, "/containers/"+container+"/exec",
		map[string]any{"Cmd": cmd, "AttachStdout": true, "AttachStderr": true}, &created); err != nil {
		return "", err
	}
	// Without an Upgrade header the engine still hijacks the connection and
	// writes the multiplexed stream as the body, closing it at the end.
	raw, err := json.Marshal(map[string]any{"Detach": false, "Tty": false})
	if err != nil {
		return "", err
	}
	req, err := http.NewRequest(http.MethodPost, e.base+"/exec/"+created.ID+"/start", bytes.NewReader(raw))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.hc.Do(req)
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	err = demux(bufio.NewReader(resp.Body), &stdout, &stderr)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("exec start: HTTP %d", resp.StatusCode)
	}
	if err != nil {
		return "", fmt.Errorf("exec stream: %w", err)
	}
	for i := 0; ; i++ {
		var insp struct {
			Running  bool
			ExitCode int
		}
		if _, err := e.do(http.MethodGet, "/exec/"+created.ID+"/json", nil, &insp); err != nil {
			return "", err
		}
		if !insp.Running {
			if insp.ExitCode != 0 {
				return "", fmt.Errorf("exec %v: exit %d: %s", cmd, insp.ExitCode, stderr.String())
			}
			return stdout.String(), nil
		}
		if i > 1000 {
			return "", fmt.Errorf("exec %v: still running after its stream ended", cmd)
		}
		time.Sleep(time.Millisecond)
	}
}

// demux splits Docker's multiplexed stream (8-byte frame headers).
func demux(r io.Reader, stdout, stderr io.Writer) error {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		w := stdout
		if hdr[0] == 2 {
			w = stderr
		}
		if _, err := io.CopyN(w, r, int64(binary.BigEndian.Uint32(hdr[4:]))); err != nil {
			return err
		}
	}
}

// run does `docker run --rm image cmd` the explicit way: create, start,
// wait until it is not running, remove it with its anonymous volumes.
func (e *engineAPI) run(image string, cmd ...string) error {
	var created struct{ ID string }
	if _, err := e.do(http.MethodPost, "/containers/create?name=eos-bench-run-"+randHex(6),
		map[string]any{"Image": image, "Cmd": cmd, "Labels": map[string]string{"eos.test": "e2e"}}, &created); err != nil {
		return err
	}
	defer func() {
		_, _ = e.do(http.MethodDelete, "/containers/"+created.ID+"?force=1&v=1", nil, nil)
	}()
	if _, err := e.do(http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		return err
	}
	var waited struct{ StatusCode int }
	if _, err := e.do(http.MethodPost, "/containers/"+created.ID+"/wait?condition=not-running", nil, &waited); err != nil {
		return err
	}
	if waited.StatusCode != 0 {
		return fmt.Errorf("run %v: exit %d", cmd, waited.StatusCode)
	}
	if _, err := e.do(http.MethodDelete, "/containers/"+created.ID+"?v=1", nil, nil); err != nil {
		return err
	}
	return nil
}

func randHex(n int) string {
	var sb strings.Builder
	for i := 0; i < n; i++ {
		sb.WriteByte("0123456789abcdef"[fastRand()%16])
	}
	return sb.String()
}

var randState atomic.Uint64

func fastRand() uint64 {
	x := randState.Add(0x9E3779B97F4A7C15)
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	return x ^ (x >> 31)
}

func init() { randState.Store(uint64(time.Now().UnixNano())) }

// dockerCLI runs the docker CLI and returns stdout.
func dockerCLI(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, tail(stderr.String()))
	}
	return stdout.String(), nil
}

// ---------------------------------------------------------------------------
// The environment one top-level benchmark shares: a sandbox and a plain
// baseline container of the same image.

type benchEnv struct {
	sb       *sandbox
	rpc      *rpcClient
	engine   *engineAPI
	baseline string // a running plain container: what `docker exec` targets

	mu       sync.Mutex
	sessions map[int][]string // per concurrency: one session per worker
}

const benchFile = "bench/f4k.txt"

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	base := baseTree()
	base[benchFile] = content4k
	sb := startSandbox(b, benchImage, base)
	env := &benchEnv{sb: sb, rpc: newRPC(sb.baseURL, sb.token), engine: newEngineAPI(b), sessions: map[int][]string{}}
	env.baseline = "eos-bench-base-" + randHex(8)
	docker(b, "run", "-d", "--name", env.baseline, "--label", "eos.test=e2e", benchImage, "sleep", "86400")
	b.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", env.baseline).Run() })
	docker(b, "exec", env.baseline, "sh", "-c", `mkdir -p /tmp/bench && printf %s "$1" > /tmp/bench/f4k.txt`, "sh", content4k)
	return env
}

// workerSessions returns c sessions, created once per concurrency.
func (env *benchEnv) workerSessions(c int) ([]string, error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	if ids, ok := env.sessions[c]; ok {
		return ids, nil
	}
	ids := make([]string, c)
	err := parallel(c, func(w int) (err error) {
		ids[w], err = env.rpc.createSession()
		return err
	})
	if err != nil {
		return nil, err
	}
	env.sessions[c] = ids
	return ids, nil
}

// dropSessions destroys the sessions of concurrency c.
func (env *benchEnv) dropSessions(b *testing.B, c int) {
	env.mu.Lock()
	ids := env.sessions[c]
	delete(env.sessions, c)
	env.mu.Unlock()
	for _, id := range ids {
		if err := env.rpc.destroySession(id); err != nil {
			b.Logf("cleanup: %v", err)
		}
	}
}

// ---------------------------------------------------------------------------
// Scenario 1: `true` in an existing session vs `docker exec <c> true`.

func BenchmarkExec(b *testing.B) {
	env := newBenchEnv(b)
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			defer env.dropSessions(b, c)
			b.Run("daemon", func(b *testing.B) {
				ws, err := env.workerSessions(c)
				if err != nil {
					b.Fatal(err)
				}
				runLoad(b, c, perC(c, 200, 500, 1000), []string{"engine", "proc"}, func(w int, parts []time.Duration) error {
					return env.rpc.execTrue(ws[w], parts)
				})
			})
			b.Run("docker-api", func(b *testing.B) {
				runLoad(b, c, perC(c, 150, 200, 300), nil, func(int, []time.Duration) error {
					_, err := env.engine.exec(env.baseline, "true")
					return err
				})
			})
			b.Run("docker-cli", func(b *testing.B) {
				runLoad(b, c, perC(c, 80, 120, 160), nil, func(int, []time.Duration) error {
					_, err := dockerCLI("exec", env.baseline, "true")
					return err
				})
			})
		})
	}
	summarize(b, map[string][]string{"daemon": {"docker-api", "docker-cli"}})
}

// ---------------------------------------------------------------------------
// Scenario 2: 4 KiB file_read and file_write in a session vs `docker exec
// cat` of a 4 KiB file (and, for writes, a docker exec that writes 4 KiB).

func BenchmarkFile(b *testing.B) {
	env := newBenchEnv(b)
	const catPath = "/tmp/bench/f4k.txt"
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			defer env.dropSessions(b, c)
			b.Run("read-daemon", func(b *testing.B) {
				ws, err := env.workerSessions(c)
				if err != nil {
					b.Fatal(err)
				}
				runLoad(b, c, perC(c, 300, 1000, 2000), nil, func(w int, _ []time.Duration) error {
					return env.rpc.readFile(ws[w], benchFile, len(content4k))
				})
			})
			b.Run("write-daemon", func(b *testing.B) {
				ws, err := env.workerSessions(c)
				if err != nil {
					b.Fatal(err)
				}
				runLoad(b, c, perC(c, 300, 1000, 2000), nil, func(w int, _ []time.Duration) error {
					return env.rpc.writeFile(ws[w], "bench/w.txt", content4k)
				})
			})
			b.Run("cat-docker-api", func(b *testing.B) {
				runLoad(b, c, perC(c, 150, 200, 300), nil, func(int, []time.Duration) error {
					out, err := env.engine.exec(env.baseline, "cat", catPath)
					if err == nil && len(out) != len(content4k) {
						err = fmt.Errorf("cat: %d bytes", len(out))
					}
					return err
				})
			})
			b.Run("cat-docker-cli", func(b *testing.B) {
				runLoad(b, c, perC(c, 60, 100, 120), nil, func(int, []time.Duration) error {
					out, err := dockerCLI("exec", env.baseline, "cat", catPath)
					if err == nil && len(out) != len(content4k) {
						err = fmt.Errorf("cat: %d bytes", len(out))
					}
					return err
				})
			})
			b.Run("write-docker-api", func(b *testing.B) {
				runLoad(b, c, perC(c, 60, 100, 150), nil, func(w int, _ []time.Duration) error {
					_, err := env.engine.exec(env.baseline, "sh", "-c", `printf %s "$1" > /tmp/bench/w-$2.txt`, "sh", content4k, strconv.Itoa(w))
					return err
				})
			})
		})
	}
	summarize(b, map[string][]string{
		"read-daemon":  {"cat-docker-api", "cat-docker-cli"},
		"write-daemon": {"write-docker-api", "cat-docker-cli"},
	})
}

// ---------------------------------------------------------------------------
// Scenario 3: session create + destroy vs `docker run --rm image true`.

func BenchmarkSession(b *testing.B) {
	env := newBenchEnv(b)
	for _, c := range concurrencies {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			b.Run("daemon", func(b *testing.B) {
				runLoad(b, c, perC(c, 100, 200, 400), []string{"create", "destroy"}, func(w int, parts []time.Duration) error {
					t0 := time.Now()
					id, err := env.rpc.createSession()
					if err != nil {
						return err
					}
					t1 := time.Now()
					err = env.rpc.destroySession(id)
					if len(parts) >= 2 {
						parts[0], parts[1] = t1.Sub(t0), time.Since(t1)
					}
					return err
				})
			})
			b.Run("docker-api-run", func(b *testing.B) {
				runLoad(b, c, perC(c, 30, 60, 100), nil, func(int, []time.Duration) error {
					return env.engine.run(benchImage, "true")
				})
			})
			b.Run("docker-cli-run", func(b *testing.B) {
				runLoad(b, c, perC(c, 20, 40, 60), nil, func(int, []time.Duration) error {
					_, err := dockerCLI("run", "--rm", "--label", "eos.test=e2e", benchImage, "true")
					return err
				})
			})
		})
	}
	summarize(b, map[string][]string{"daemon": {"docker-api-run", "docker-cli-run"}})
}

// ---------------------------------------------------------------------------
// Where the daemon's time goes: the RPC floor (health: auth, routing, JSON,
// no work) through the published port (docker-proxy, the product's path)
// and straight to the container's bridge address, and exec and read on the
// direct path. Concurrency 1.

func BenchmarkRPCPath(b *testing.B) {
	env := newBenchEnv(b)
	ip := docker(b, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", env.sb.name)
	if ip == "" {
		b.Skip("the sandbox container has no bridge address")
	}
	direct := newRPC("http://"+net.JoinHostPort(ip, "7001"), env.sb.token)
	if err := direct.call("health", map[string]any{}, nil); err != nil {
		b.Skipf("container address %s not reachable from the host: %v", ip, err)
	}
	u, _ := url.Parse(env.sb.baseURL)
	b.Logf("published %s, direct %s", u.Host, ip)
	ws, err := env.workerSessions(1)
	if err != nil {
		b.Fatal(err)
	}
	n := sampleCount(300)
	for _, path := range []struct {
		name string
		rpc  *rpcClient
	}{{"published", env.rpc}, {"direct", direct}} {
		r := path.rpc
		b.Run("health/"+path.name, func(b *testing.B) {
			runLoad(b, 1, n, nil, func(int, []time.Duration) error { return r.call("health", map[string]any{}, nil) })
		})
		b.Run("exec/"+path.name, func(b *testing.B) {
			runLoad(b, 1, n, []string{"engine", "proc"}, func(_ int, parts []time.Duration) error { return r.execTrue(ws[0], parts) })
		})
		b.Run("read/"+path.name, func(b *testing.B) {
			runLoad(b, 1, n, nil, func(int, []time.Duration) error { return r.readFile(ws[0], benchFile, len(content4k)) })
		})
		b.Run("write/"+path.name, func(b *testing.B) {
			runLoad(b, 1, n, nil, func(int, []time.Duration) error { return r.writeFile(ws[0], "bench/w.txt", content4k) })
		})
	}
}
