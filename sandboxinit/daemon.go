package sandboxinit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/ephemeral-sandbox/sandbox/internal/spreaddir"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/command"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/observe"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
)

// Config is the daemon's configuration (flags of sandbox-daemon).
type Config struct {
	StateDir        string        // the state volume, default /eos
	Listen          string        // RPC address, default :7001
	TokenFile       string        // 0600 file holding the sandbox's token; when it exists it wins over TokenSHA256
	TokenSHA256     string        // hex SHA-256 of the sandbox's token (--token-sha256): a verifier, not the token
	SelfPath        string        // this binary, as seen inside sessions (it runs as each session's init)
	SessinitPath    string        // the small session init (cmd/sandbox-sessinit); "" = SelfPath as "sessinit"
	MaxRequestBytes int64         // default 16 MiB
	MaxConcurrent   int           // requests served at once before server_busy, default 128
	ShutdownGrace   time.Duration // default 10 s
	Hidden          []string      // more paths masked inside sessions
	AutoSquashAt    int
	Logger          *slog.Logger

	// Budgets: past them requests are refused with resource_exhausted (or,
	// for retained output, the oldest finished commands lose theirs).
	MaxSessions        int   // live workspace sessions, default 256
	WarmSessions       int   // pre-started sessions a plain create adopts (warm.go): 0 (none) to MaxWarmSessions
	MaxRunningCommands int   // commands running at once, default 512
	OutputBudget       int64 // output kept by all commands; finished ones lose theirs first; default 256 MiB
	MaxPublishBytes    int64 // bytes of files in one change set, default 1 GiB

	// The background lane (lane.go): heavy operations run at most
	// BackgroundLanes at once (0: max(1, NumCPU/2)), FIFO, refused with
	// server_busy past BackgroundQueueWait (0: 1 min), on threads of nice
	// BackgroundNice (0: DefaultBackgroundNice, negative: normal weight).
	BackgroundLanes     int
	BackgroundQueueWait time.Duration
	BackgroundNice      int
	// WarmNice is the nice value (1-19) of the daemon's threads that build
	// warm sessions and finish destroyed sessions' teardowns (0: normal
	// weight); the sessions' own processes are never niced.
	WarmNice int

	// Observability (seed-spec §6). SandboxID names the sandbox in the
	// views when the gateway does not pass sandbox_id.
	SandboxID       string
	EventBudget     int64         // spans and events on disk, default 4 MiB
	SampleBudget    int64         // resource samples on disk, default 1 MiB
	SampleInterval  time.Duration // default 2 s, while active
	SampleIdleAfter time.Duration // sampling stops this long after the last request, default 10 s

	// GuardIngress writes the sandbox's ingress table (runtime.GuardIngress):
	// nothing new from outside the sandbox but connections to the Listen
	// port. Only inside the sandbox's container (the binary's
	// --ingress-guard says when): in a host's namespace it would cut the host
	// off.
	GuardIngress bool
}

func (c *Config) defaults() {
	if c.StateDir == "" {
		c.StateDir = "/eos"
	}
	if c.Listen == "" {
		c.Listen = ":7001"
	}
	if c.TokenFile == "" {
		c.TokenFile = filepath.Join(c.StateDir, "secret", "daemon.token")
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 16 << 20
	}
	if c.MaxRequestBytes < 64<<10 {
		c.MaxRequestBytes = 64 << 10
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 128
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	c.WarmSessions = min(max(c.WarmSessions, 0), MaxWarmSessions)
	if c.MaxRunningCommands <= 0 {
		c.MaxRunningCommands = command.DefaultMaxRunning
	}
	if c.OutputBudget <= 0 {
		c.OutputBudget = command.DefaultOutputBudget
	}
	if c.MaxPublishBytes <= 0 {
		c.MaxPublishBytes = DefaultMaxPublishBytes
	}
	if c.BackgroundLanes <= 0 {
		c.BackgroundLanes = defaultLanes()
	}
	if c.BackgroundQueueWait <= 0 {
		c.BackgroundQueueWait = DefaultBackgroundQueueWait
	}
	if c.BackgroundNice == 0 {
		c.BackgroundNice = DefaultBackgroundNice
	}
	c.BackgroundNice = min(c.BackgroundNice, 19)
	c.WarmNice = min(c.WarmNice, 19)
}

// hidden are the paths no session may see: the whole state volume (layers,
// other sessions' upper dirs, the token) and anything configured.
func (c *Config) hidden() []string {
	out := []string{c.StateDir}
	if filepath.Dir(c.TokenFile) != c.StateDir && !isUnderDir(c.TokenFile, c.StateDir) {
		out = append(out, c.TokenFile)
	}
	return append(out, c.Hidden...)
}

func isUnderDir(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !filepath.IsAbs(rel) && (len(rel) < 3 || rel[:3] != "../")
}

// Daemon is the in-container runtime: the layer store, the sessions and the
// commands running in them.
type Daemon struct {
	cfg Config
	log *slog.Logger
	// tokenSum is the SHA-256 of the sandbox token: a presented token is
	// hashed and compared with it (server.go authorized).
	tokenSum [sha256.Size]byte
	ingress  map[string]any // the ingress guard's state, for the daemon view (guardIngress)
	store    *layerstack.Store
	rt       *runtime.Runtime
	cmds     *command.Engine

	mu       sync.Mutex
	sessions map[string]*session
	creating int // sessions admitted by admitSession and not yet in sessions
	// creatingBy: the creates in flight, by request id (createOnce).
	creatingBy map[string]chan struct{}
	warm       warmPool // guarded by mu
	// txs serialises the steps of one publish transaction (prepare,
	// commit, finalize, abort, and the boot reconcile), never two.
	txs txLocks
	// bg counts the finalizes running after their publish answered
	// (publishTx); Close waits for them.
	bg      sync.WaitGroup
	obs     *observe.Observer
	started time.Time
	// lane admits the heavy background operations (lane.go).
	lane *lane
	// inflight counts the requests being served, by operation (server.go):
	// /health and the daemon view show them.
	inflight inFlight
}

// New opens the state volume, the layer store and the session runtime, and
// brings back the sessions recorded on the volume.
func New(ctx context.Context, cfg Config) (*Daemon, error) {
	cfg.defaults()
	tok, err := tokenSum(cfg.TokenFile, cfg.TokenSHA256)
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"layerstack", "sessions", "archive", "runtime", "txns"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	// A session, its runtime state and a publish's record are each a
	// directory made and removed within minutes: spread over the file
	// system's groups, their creates do not scan each other's freed inodes
	// (spreaddir's doc).
	for _, sub := range []string{"sessions", "runtime", "txns"} {
		if ok, err := spreaddir.Spread(filepath.Join(cfg.StateDir, sub)); err != nil {
			cfg.Logger.Info("state dir: subdirectories not spread", "dir", sub, "err", err)
		} else if ok && sub == "sessions" {
			cfg.Logger.Info("state dir: subdirectories spread over the file system's groups (ext4)")
		}
	}
	store, err := layerstack.Open(filepath.Join(cfg.StateDir, "layerstack"), layerstack.Options{AutoSquashAt: cfg.AutoSquashAt, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	rt, err := runtime.New(filepath.Join(cfg.StateDir, "runtime"))
	if err != nil {
		store.Close()
		return nil, err
	}
	var ingress map[string]any // nil: not asked for (openObservability says off)
	if cfg.GuardIngress {
		ingress = guardIngress(cfg.Listen, cfg.Logger)
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, tokenSum: tok, store: store, rt: rt, ingress: ingress,
		cmds: command.New(command.Options{MaxRunning: cfg.MaxRunningCommands, OutputBudget: cfg.OutputBudget}), sessions: map[string]*session{}, started: time.Now(),
		lane: newLane(cfg.BackgroundLanes, cfg.BackgroundQueueWait, cfg.BackgroundNice, cfg.Logger)}
	if cfg.BackgroundNice < 0 {
		cfg.Logger.Info("background lane at normal CPU weight (--background-nice < 0)", "lanes", cfg.BackgroundLanes)
	} else {
		// A niced thread the kernel keeps waiting still holds its P: give
		// the scheduler one P per lane on top, so interactive goroutines
		// keep every core's worth of Ps.
		procs := goruntime.GOMAXPROCS(0) + cfg.BackgroundLanes
		goruntime.GOMAXPROCS(procs)
		cfg.Logger.Info("background lane", "lanes", cfg.BackgroundLanes, "nice", cfg.BackgroundNice, "gomaxprocs", procs)
	}
	if err := d.openObservability(); err != nil {
		store.Close()
		return nil, err
	}
	if err := d.restoreSessions(ctx); err != nil {
		return nil, err
	}
	d.sweepSessionLeases(ctx)
	d.reconcilePublishes(ctx)
	d.sweepTxns()
	d.sweepTrash()
	d.startWarm()
	return d, nil
}

// Close stops admitting commands, ends them after the grace, and closes the
// store. Sessions keep running (they are re-attached on the next start);
// the container's stop ends them.
func (d *Daemon) Close(ctx context.Context) error {
	d.stopWarm(ctx)
	d.cmds.Shutdown(ctx, d.cfg.ShutdownGrace)
	d.waitFinalizes(ctx)
	return errors.Join(d.closeObservability(), d.store.Close())
}

// tokenSum is what the daemon checks a presented token against: the
// SHA-256 of the token file's contents when the file exists, else the
// digest given by --token-sha256. The product passes the digest as an
// argument of a new container (no copy into the container before start,
// and argv then shows a digest an attacker cannot turn back into the
// token); it copies the file only where a container's argument cannot
// change: an adopted container whose deployment, and so whose token, is
// new. Neither given is an error.
func tokenSum(file, digest string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	b, err := readToken(file)
	switch {
	case err == nil:
		return sha256.Sum256(b), nil
	case !errors.Is(err, fs.ErrNotExist) || digest == "":
		return sum, err
	}
	raw, derr := hex.DecodeString(digest)
	if derr != nil || len(raw) != sha256.Size {
		return sum, fmt.Errorf("--token-sha256: want the token's SHA-256 as %d hex digits, got %d characters", 2*sha256.Size, len(digest))
	}
	copy(sum[:], raw)
	return sum, nil
}

func readToken(name string) ([]byte, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("daemon token: %w (the product passes --token-sha256 or copies the file in before start)", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("daemon token %s has mode %04o: it must be readable by its owner only (0600)", name, fi.Mode().Perm())
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	if len(b) < 16 {
		return nil, fmt.Errorf("daemon token %s is shorter than 16 bytes", name)
	}
	return b, nil
}

// guardIngress writes the sandbox's ingress table for the port of listen
// (runtime.GuardIngress) and returns what the daemon view says of it.
// Where it cannot (no NET_ADMIN, no nf_tables in the kernel) the sandbox
// still runs, isolated by Docker's rules alone, and the log and the view
// say so.
func guardIngress(listen string, log *slog.Logger) map[string]any {
	_, p, err := net.SplitHostPort(listen)
	port := 0
	if err == nil {
		port, err = net.LookupPort("tcp", p) // as net.Listen reads it: "http" is 80
	}
	if err != nil || port == 0 {
		log.Warn("no ingress guard: the listen address has no port", "listen", listen)
		return map[string]any{"state": "unavailable", "error": fmt.Sprintf("listen address %q has no port", listen)}
	}
	if err := runtime.GuardIngress(uint16(port)); err != nil {
		log.Warn("no ingress guard: only Docker's rules keep other sandboxes out", "err", err)
		return map[string]any{"state": "unavailable", "error": err.Error()}
	}
	log.Info("ingress guard: nothing new enters the sandbox but the daemon's port", "port", port, "table", runtime.IngressTable)
	return map[string]any{"state": "on", "port": port, "table": runtime.IngressTable}
}
