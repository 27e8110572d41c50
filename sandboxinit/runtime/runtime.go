package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Runtime creates and re-attaches sessions. It is safe for concurrent use.
type Runtime struct {
	root     string // libcontainer's state root
	cgroups  cgroupSetup
	seccomp  seccompSetup
	netAdmin bool
	fwErr    error // why the sandbox's nftables rules could not be written (isolated sessions are refused)
	log      *slog.Logger
	exe      *os.File // this binary, for libcontainer execs of sessions (sessexec)

	mu       sync.Mutex
	starting map[string]bool // ids between validation and a created container
	netMu    sync.Mutex      // serialises subnet choice and veth creation

	netsMu sync.Mutex
	dns    map[string]*dnsForwarder  // isolated sessions' resolvers (dns_linux.go)
	netns  map[string]netns.NsHandle // isolated sessions' network namespaces (netns_linux.go)
}

// New prepares the runtime: libcontainer's state root under stateRoot, the
// cgroup hierarchy (remounted read-write; on v2 the daemon moves into a leaf
// and delegates to "sessions"), and a preflight that names everything
// missing in one error wrapping ErrUnsupported.
func New(stateRoot string) (*Runtime, error) {
	r := &Runtime{
		root:     filepath.Join(stateRoot, "containers"),
		log:      slog.Default().With("component", "session_runtime"),
		starting: make(map[string]bool),
		dns:      make(map[string]*dnsForwarder),
		netns:    make(map[string]netns.NsHandle),
	}
	var errs []error
	netAdmin, err := checkCaps()
	r.netAdmin = netAdmin
	errs = append(errs, err)
	if err == nil { // without SYS_ADMIN these errors only repeat it
		r.seccomp, err = checkSeccomp()
		errs = append(errs, err)
		r.cgroups, err = prepareCgroups()
		errs = append(errs, err)
	}
	errs = append(errs, checkOverlay(), checkOpenat2())
	if r.exe, err = os.OpenFile("/proc/self/exe", os.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		errs = append(errs, fmt.Errorf("open own binary: %w", err))
	}
	if err := os.MkdirAll(r.root, 0o700); err != nil {
		errs = append(errs, fmt.Errorf("create state root: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("session runtime preflight: %w", err)
	}
	r.fwErr = fmt.Errorf("%w: the sandbox has no NET_ADMIN", ErrNoNftables)
	if r.netAdmin {
		if r.fwErr = ensureFirewall(); r.fwErr != nil {
			r.log.Warn("isolated sessions are unavailable: the sandbox's nftables rules could not be written", "err", r.fwErr)
		}
	}
	r.log.Info("session runtime ready", "state_root", r.root, "cgroup_v2", r.cgroups.v2,
		"swap_accounting", r.cgroups.swap, "net_admin", r.netAdmin, "no_new_keyring", r.seccomp.noNewKeyring,
		"session_seccomp_rules", len(r.seccomp.session.config().Syscalls))
	return r, nil
}

func checkOverlay() error {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("read /proc/filesystems: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(strings.TrimPrefix(line, "nodev")) == "overlay" {
			return nil
		}
	}
	return fmt.Errorf("%w: the kernel has no overlay file system", ErrUnsupported)
}

// openat2 is unix.Openat2 (a test stands in a kernel without it).
var openat2 = unix.Openat2

// checkOpenat2: the daemon reaches every file of a session through openat2
// (RESOLVE_IN_ROOT, RESOLVE_NO_SYMLINKS), which Linux has since 5.6. On an
// older kernel the first file operation would fail with ENOSYS; the
// preflight names it at start instead.
func checkOpenat2() error {
	fd, err := openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			var u unix.Utsname
			_ = unix.Uname(&u)
			return fmt.Errorf("%w: the kernel (%s) has no openat2, which sessions' file operations need: Linux 5.6 or later", ErrUnsupported, unix.ByteSliceToString(u.Release[:]))
		}
		return fmt.Errorf("openat2 /: %w", err)
	}
	return unix.Close(fd)
}

// Sessions lists the ids of sessions with runtime state, running or not
// (Load tells which).
func (r *Runtime) Sessions() ([]string, error) {
	return listContainers(r.root)
}

// claim reserves id for a Start; the returned func releases it.
func (r *Runtime) claim(id string) (func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.starting[id] {
		return nil, fmt.Errorf("%w: %s is being started", ErrExists, id)
	}
	if _, err := os.Stat(filepath.Join(r.root, id)); err == nil {
		return nil, fmt.Errorf("%w: %s", ErrExists, id)
	}
	r.starting[id] = true
	return func() {
		r.mu.Lock()
		delete(r.starting, id)
		r.mu.Unlock()
	}, nil
}

// Start creates and starts session spec.ID: it mounts the root overlay,
// creates the veth pair for an isolated session, creates the container and
// runs spec.InitPath as its PID 1. On error nothing is left running and the
// root overlay is unmounted.
func (r *Runtime) Start(ctx context.Context, spec SessionSpec) (_ *Session, retErr error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	if r.seccomp.session == nil { // New always builds it: never start a session without it
		return nil, fmt.Errorf("start %s: %w: no session seccomp filter", spec.ID, ErrUnsupported)
	}
	if spec.Isolated && !r.netAdmin {
		return nil, fmt.Errorf("start %s: %w: isolated sessions need NET_ADMIN in the sandbox", spec.ID, ErrUnsupported)
	}
	if spec.Isolated && r.fwErr != nil {
		// Without the rules isolated sessions would reach each other.
		return nil, fmt.Errorf("start %s: %w: isolated sessions need nf_tables in the sandbox's kernel: %w", spec.ID, ErrUnsupported, r.fwErr)
	}
	release, err := r.claim(spec.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(spec.Workspace); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("start %s: %w: workspace %s is not a directory (%v)", spec.ID, ErrInvalidSpec, spec.Workspace, err)
	}
	s := &Session{r: r, spec: spec, dirs: rootDirsOf(spec.Dir)}
	defer func() {
		if retErr != nil {
			_ = s.teardown(context.WithoutCancel(ctx))
			retErr = fmt.Errorf("start %s: %w", spec.ID, retErr)
		}
	}()
	if err := mountRoot(s.dirs); err != nil {
		return nil, err
	}
	cs := containerSpec{
		id: spec.ID, rootfs: s.dirs.merged, workspace: spec.Workspace,
		limits: spec.Limits, swap: r.cgroups.swap, noNewKeyring: r.seccomp.noNewKeyring,
		seccomp: r.seccomp.session, preloaded: r.seccomp.compiled != nil,
	}
	cs.hiddenDirs, cs.hiddenFiles = splitHidden(spec.Hidden)
	gateway := ""
	if spec.Isolated {
		if cs.net, err = r.createNet(spec); err != nil {
			return nil, err
		}
		s.ip, gateway = cs.net.addr, cs.net.gateway
		if err := r.startSessionDNS(spec.ID, spec.Egress, gateway); err != nil {
			return nil, err
		}
	}
	if err := writeEtc(s.dirs, spec.ID, s.ip, sessionResolvConf(spec.Isolated, spec.Egress, gateway)); err != nil {
		return nil, err
	}
	if s.c, err = createContainer(r.root, cs); err != nil {
		return nil, err
	}
	if err := s.startInit(ctx); err != nil {
		return nil, err
	}
	if spec.Isolated {
		// Before Start returns, so before any of the session's own
		// processes runs.
		if err := r.attachNetns(s); err != nil {
			return nil, err
		}
	}
	r.log.Info("session started", "session_id", spec.ID, "isolated", spec.Isolated, "ip", s.ip)
	return s, nil
}

func (r *Runtime) createNet(spec SessionSpec) (*netSpec, error) {
	r.netMu.Lock()
	defer r.netMu.Unlock()
	var want *subnet
	if spec.Addr != "" {
		sn, err := subnetOf(spec.Addr)
		if err != nil {
			return nil, err
		}
		want = &sn
	}
	// Our own pair from a crashed earlier start must not count as "in use".
	_ = deleteVeth(spec.ID)
	used, err := usedSubnets()
	if err != nil {
		return nil, err
	}
	sn, err := pickSubnet(spec.ID, want, used)
	if err != nil {
		return nil, err
	}
	ns, err := createVeth(spec.ID, sn)
	if err != nil {
		return nil, err
	}
	// Before the session's init runs: it never sends a packet unfiltered.
	if err := applyEgress(spec.ID, spec.Egress, sn.gateway()); err != nil {
		_ = deleteVeth(spec.ID)
		return nil, err
	}
	return ns, nil
}

// Reap removes whatever is left of session id, its init running or not
// (container state and processes, cgroup, root mount, veth, resolver,
// egress rules; never the upper dir), without re-attaching to it: for a
// close that lost its handle on the session, after a destroy that failed
// part way (an isolated session's veth may be gone already, which Load
// would refuse). Nothing left is not an error.
func (r *Runtime) Reap(ctx context.Context, id string, spec SessionSpec) error {
	if spec.ID != id {
		return fmt.Errorf("reap %s: %w: spec is for %q", id, ErrInvalidSpec, spec.ID)
	}
	if err := spec.validate(); err != nil {
		return fmt.Errorf("reap %s: %w", id, err)
	}
	s := &Session{r: r, spec: spec, dirs: rootDirsOf(spec.Dir)}
	c, _, lerr := loadContainer(r.root, id)
	if errors.Is(lerr, ErrGone) {
		lerr = nil
	}
	s.c = c // nil when there is no container state (or it cannot be read)
	// The rest (root mount, veth, resolver, egress rules) goes even when
	// the container's state cannot be read; that error is still the
	// answer, since its processes may live on.
	if err := errors.Join(lerr, s.teardown(ctx)); err != nil {
		return fmt.Errorf("reap %s: %w", id, err)
	}
	return nil
}

// Load re-attaches to session id after the daemon restarted (the sandbox
// container, its mounts and the session processes lived on). spec must be
// the spec the session was started with. When the session's init is gone,
// Load removes what is left of it (container state, cgroup, root mount, veth;
// never the upper dir) and returns an error wrapping ErrGone.
func (r *Runtime) Load(id string, spec SessionSpec) (*Session, error) {
	if spec.ID != id {
		return nil, fmt.Errorf("load %s: %w: spec is for %q", id, ErrInvalidSpec, spec.ID)
	}
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("load %s: %w", id, err)
	}
	s := &Session{r: r, spec: spec, dirs: rootDirsOf(spec.Dir)}
	c, running, err := loadContainer(r.root, id)
	if err == nil && running {
		s.c = c
		if spec.Isolated {
			if s.ip, err = vethAddr(id); err != nil {
				return nil, fmt.Errorf("load %s: %w", id, err)
			}
			// The rules live in the sandbox's namespace and survive a
			// daemon restart; rewrite them anyway (an older daemon had none).
			gw, err := gatewayOf(s.ip)
			if err != nil {
				return nil, fmt.Errorf("load %s: %w", id, err)
			}
			if err := applyEgress(id, spec.Egress, gw); err != nil {
				return nil, fmt.Errorf("load %s: %w", id, err)
			}
			if err := r.startSessionDNS(id, spec.Egress, gw.String()); err != nil {
				// The session runs on; only its name resolution is gone.
				r.log.Warn("isolated session without its resolver", "session_id", id, "err", err)
			}
			if err := r.attachNetns(s); err != nil {
				return nil, fmt.Errorf("load %s: %w", id, err)
			}
		}
		s.fastSock = execSocketPath(spec.Dir)
		if !c.filtered() {
			r.log.Warn("session runs without its own seccomp filter (started by an older daemon); restart it to get one",
				"session_id", id)
		}
		return s, nil
	}
	if err != nil && !errors.Is(err, ErrGone) {
		return nil, fmt.Errorf("load %s: %w", id, err)
	}
	s.c = c // nil when there was no state at all
	if terr := s.teardown(context.Background()); terr != nil {
		return nil, fmt.Errorf("load %s: clean up after exited init: %w", id, terr)
	}
	return nil, fmt.Errorf("load %s: %w", id, ErrGone)
}
