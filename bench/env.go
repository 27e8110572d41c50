package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	dockerclient "github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"google.golang.org/grpc"

	"github.com/ephemeral-sandbox/sandbox/activities"
	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
	"github.com/ephemeral-sandbox/sandbox/gateway"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/worker"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// StackOptions say how to run the product for a benchmark.
type StackOptions struct {
	DaemonBinary string   // the static sandbox-daemon (make daemon: bin/sandbox-daemon)
	DaemonArgs   []string // more sandbox-daemon flags for every sandbox (-daemon-args)
	Seccomp      string   // profile path ("" = found next to the daemon or in the tree)
	StateDir     string   // embedded Temporal's SQLite and the secret
	AllowRoots   []string // where workspaces and exports may be (--allow-root; none = home and cwd)
	Log          *slog.Logger
	// NoStandby turns the gateway's standby sandboxes off (make run keeps
	// them on).
	NoStandby bool
}

// Stack is the whole product in this process, as `make run` starts it: the
// embedded Temporal dev server, the workers, and the gateway on a loopback
// port, driven over HTTP like any client (keep-alive connections).
type Stack struct {
	Client *client.Client
	Addr   string
	Docker *dockerclient.Client
	Acts   *activities.Activities
	Server *gateway.Server
	// Backend is the gateway's backend (its standby pool).
	Backend *gateway.TemporalBackend
	svc     *worker.Service
	cancel  context.CancelFunc
	secret  []byte
}

// StartStack starts the product.
func StartStack(ctx context.Context, o StackOptions) (*Stack, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	roots := o.AllowRoots
	if len(roots) == 0 {
		roots = hostpath.DefaultRoots()
	}
	hostPaths, err := hostpath.New(roots, o.StateDir)
	if err != nil {
		return nil, err
	}
	acts, err := worker.BuildActivities(secret, o.DaemonBinary, o.Seccomp, hostPaths, o.Log)
	if err != nil {
		return nil, err
	}
	if len(o.DaemonArgs) > 0 {
		activities.SetDaemonArgs(acts, o.DaemonArgs)
	}
	dc, err := activities.NewDockerClient()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	metrics := gateway.NewMetrics()
	svc, err := worker.Start(ctx, worker.Options{StateDir: o.StateDir, EmbeddedAddress: "127.0.0.1:0", UIAddress: "off",
		Activities: acts, Secret: secret, HostQueue: fmt.Sprintf("eos-bench-%d", time.Now().UnixNano()), Logger: o.Log,
		ClientInterceptors: []grpc.UnaryClientInterceptor{metrics.TemporalInterceptor()}})
	if err != nil {
		cancel()
		return nil, err
	}
	token := hexToken()
	// As make run: the sandboxes on this process's own workers are on this machine.
	backend := &gateway.TemporalBackend{Client: svc.Client, HostQueue: svc.HostQueue, Secret: secret, HostPaths: hostPaths,
		LocalQueue: svc.HostQueue, LocalName: "bench", Standby: gateway.StandbyOptions{Enabled: !o.NoStandby}, Log: o.Log}
	srv := gateway.New(backend, token, o.Log)
	srv.SetMetrics(metrics)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Stop()
		cancel()
		return nil, err
	}
	go func() { _ = srv.Serve(ctx, l) }()
	_ = backend.StartSpare(ctx) // as make run's gateway does at its start
	addr := l.Addr().String()
	c := client.New("http://"+addr, token)
	c.HTTP = &http.Client{Transport: timingTransport{&http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}, Timeout: 30 * time.Minute}
	return &Stack{Client: c, Addr: addr, Docker: dc, Acts: acts, Server: srv, Backend: backend, svc: svc, cancel: cancel, secret: secret}, nil
}

func hexToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// Close stops the product.
func (s *Stack) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.Backend.CloseStandbys(ctx)
	s.cancel()
	s.svc.Stop()
}

// Call runs one operation through the gateway; sandboxID "" is system scope.
func (s *Stack) Call(ctx context.Context, op, sandboxID string, args map[string]any) (map[string]any, error) {
	scope := jsonl.SystemScope()
	if sandboxID != "" {
		scope = jsonl.SandboxScope(sandboxID)
	}
	raw, err := s.Client.Call(ctx, op, scope, args, "")
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// CreateSandbox creates a sandbox over root and returns its id, once the
// standby the create starts in the background is made (so no scenario
// times its commands beside Docker making it).
func (s *Stack) CreateSandbox(ctx context.Context, image, root string) (string, error) {
	id, err := s.CreateSandboxOnly(ctx, image, root)
	if err == nil {
		err = s.SettleStandby(ctx, image)
	}
	return id, err
}

// CreateSandboxOnly is create_sandbox alone, as a user times it.
func (s *Stack) CreateSandboxOnly(ctx context.Context, image, root string) (string, error) {
	rec, err := s.Call(ctx, "create_sandbox", "", map[string]any{"image": image, "workspace_root": root})
	if err != nil {
		return "", err
	}
	id, _ := rec["id"].(string)
	return id, nil
}

// SettleStandby waits until the gateway's standby of image, and its spare
// if it has one, wait for a claim (at once when standbys are off or none
// was started).
func (s *Stack) SettleStandby(ctx context.Context, image string) error {
	if !s.Backend.Standby.Enabled {
		return nil
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pending := s.Backend.StandbyPending()
		ready, spare := false, true
		for _, sb := range s.Backend.Standbys(ctx) {
			ready = ready || (sb.Image == image && sb.State == workflows.PhaseStandby)
			spare = spare && (sb.Image != "" || sb.State == workflows.PhaseStandby)
		}
		if ready && spare && !pending {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no standby of %s after 2 minutes", image)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DestroySandbox removes a sandbox (best effort).
func (s *Stack) DestroySandbox(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = s.Call(ctx, "destroy_sandbox", "", map[string]any{"sandbox_id": id})
}

// Session creates a workspace session and returns its id.
func (s *Stack) Session(ctx context.Context, sandboxID, agent string) (string, error) {
	m, err := s.Call(ctx, "create_workspace_session", sandboxID, map[string]any{"agent": agent})
	if err != nil {
		return "", err
	}
	id, _ := m["workspace_session_id"].(string)
	return id, nil
}

// Exec runs cmd in a session and fails unless it exits 0.
func (s *Stack) Exec(ctx context.Context, sandboxID, ws, cmd string) error {
	m, err := s.Call(ctx, "exec_command", sandboxID, map[string]any{"cmd": cmd, "workspace_session_id": ws, "yield_time_ms": 300000})
	if err != nil {
		return err
	}
	if m["status"] != api.StatusOK {
		return fmt.Errorf("%s: %v %v: %.300v", cmd, m["status"], m["exit_code"], m["output"])
	}
	return nil
}

// --- baselines: the Docker Engine API, as container-per-agent tools use it ---

// Baseline is a long-running container of the benchmark image, the target
// of docker exec baselines.
type Baseline struct {
	ID     string
	docker *dockerclient.Client
}

// StartBaseline runs `sleep` in a fresh container of image.
func StartBaseline(ctx context.Context, dc *dockerclient.Client, image string) (*Baseline, error) {
	name := fmt.Sprintf("eos-bench-baseline-%d", time.Now().UnixNano())
	created, err := dc.ContainerCreate(ctx, &container.Config{Image: image, Cmd: []string{"sleep", "86400"}, Labels: map[string]string{"eos.bench": "1"}},
		&container.HostConfig{}, nil, nil, name)
	if err != nil {
		return nil, err
	}
	if err := dc.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		_ = dc.ContainerRemove(ctx, created.ID, container.RemoveOptions{Force: true})
		return nil, err
	}
	return &Baseline{ID: created.ID, docker: dc}, nil
}

// Close removes the container.
func (b *Baseline) Close() {
	_ = b.docker.ContainerRemove(context.Background(), b.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
}

// DockerExec does what `docker exec` does through the Engine API: create
// the exec, start it attached, read its output to the end, inspect its
// exit code. stdin, when not nil, is written to the command.
func DockerExec(ctx context.Context, dc *dockerclient.Client, id string, cmd []string, stdin []byte) ([]byte, error) {
	ex, err := dc.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: cmd, AttachStdout: true, AttachStderr: true, AttachStdin: stdin != nil})
	if err != nil {
		return nil, err
	}
	hj, err := dc.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, err
	}
	defer hj.Close()
	if stdin != nil {
		_, _ = hj.Conn.Write(stdin)
		_ = hj.CloseWrite()
	}
	var out, errb bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errb, hj.Reader); err != nil && err != io.EOF {
		return nil, err
	}
	insp, err := dc.ContainerExecInspect(ctx, ex.ID)
	if err != nil {
		return nil, err
	}
	if insp.ExitCode != 0 {
		return out.Bytes(), fmt.Errorf("docker exec %v: exit %d: %s", cmd, insp.ExitCode, errb.String())
	}
	return out.Bytes(), nil
}

// DockerRun does what `docker run --rm image cmd` does: create, start,
// wait for the exit, remove.
func DockerRun(ctx context.Context, dc *dockerclient.Client, image string, cmd []string) error {
	created, err := dc.ContainerCreate(ctx, &container.Config{Image: image, Cmd: cmd, Labels: map[string]string{"eos.bench": "1"}},
		&container.HostConfig{}, nil, nil, "")
	if err != nil {
		return err
	}
	defer func() {
		_ = dc.ContainerRemove(context.Background(), created.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
	}()
	if err := dc.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return err
	}
	okc, errc := dc.ContainerWait(ctx, created.ID, container.WaitConditionNotRunning)
	select {
	case r := <-okc:
		if r.StatusCode != 0 {
			return fmt.Errorf("docker run %v: exit %d", cmd, r.StatusCode)
		}
		return nil
	case err := <-errc:
		return err
	}
}

// --- repositories ---

// MakeRepo writes a git repository of n text files of size bytes each (in
// directories of 100) into dir and commits it.
func MakeRepo(dir string, n, size int) error {
	line := strings.Repeat("x", 63) + "\n"
	body := strings.Repeat(line, max(size/len(line), 1))
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("pkg%03d", i/100), fmt.Sprintf("file%05d.txt", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("file %d\n%s", i, body)), 0o644); err != nil {
			return err
		}
	}
	// gc now, in the foreground: an automatic one detached in the background
	// would repack while a sandbox copies the repository.
	for _, args := range [][]string{{"init", "-q"}, {"config", "gc.auto", "0"}, {"add", "-A"},
		{"-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "commit", "-qm", "base"}, {"gc", "-q"}} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("git %v: %v: %s", args, err, out)
		}
	}
	return nil
}

// GitWorktree adds a detached worktree of repo at dst (the git-native way
// to give each agent its own checkout) and returns how to remove it.
func GitWorktree(repo, dst string) (remove func(), err error) {
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "-q", "--detach", dst).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("git worktree add: %v: %s", err, out)
	}
	return func() { _ = exec.Command("git", "-C", repo, "worktree", "remove", "--force", dst).Run() }, nil
}

// CommitWorktree is GitWorktree for a baseline that commits in it: its
// removal also drops those commits' objects, which live in repo's own
// store. Left there, they turned the next scenario's "1k files (4 MiB)"
// repository into one with 86 MB of loose objects in its .git (scenario f
// after d's git baseline copied them on both sides, 5-10x slower).
func CommitWorktree(repo, dst string) (remove func(), err error) {
	rm, err := GitWorktree(repo, dst)
	if err != nil {
		return nil, err
	}
	return func() {
		rm()
		if out, err := exec.Command("git", "-C", repo, "gc", "-q", "--prune=now").CombinedOutput(); err != nil {
			slog.Warn("git gc after a committing baseline", "repo", repo, "err", err, "out", string(out))
		}
	}, nil
}

// DiskBytes is the space a directory tree takes on disk (du -sk).
func DiskBytes(dir string) int64 {
	out, err := exec.Command("du", "-sk", dir).Output()
	return duBytes(out, err)
}

// ContainerDiskBytes is DiskBytes of a path inside a sandbox's container.
func ContainerDiskBytes(ctx context.Context, dc *dockerclient.Client, sandboxID, path string) int64 {
	// -x: the session dir holds its workspace mount point, whose merged
	// view is the layers, not the session.
	out, err := DockerExec(ctx, dc, workflows.ContainerName(sandboxID), []string{"du", "-skx", path}, nil)
	return duBytes(out, err)
}

// duBytes reads du -sk's first field as bytes (-1 when du failed).
func duBytes(out []byte, err error) int64 {
	f := strings.Fields(string(out))
	if err != nil || len(f) == 0 {
		return -1
	}
	kb, _ := strconv.ParseInt(f[0], 10, 64)
	return kb * 1024
}

// SettleDisk flushes dirty pages and waits (up to a minute) until the
// kernel has little left to write back, so a sample that writes a lot does
// not pay for the writeback of the one before it.
func SettleDisk() {
	deadline := time.Now().Add(time.Minute)
	for {
		syscall.Sync()
		if dirtyBytes() < 8<<20 || time.Now().After(deadline) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dirtyBytes is Dirty + Writeback of /proc/meminfo.
func dirtyBytes() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var total int64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && (f[0] == "Dirty:" || f[0] == "Writeback:") {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}
