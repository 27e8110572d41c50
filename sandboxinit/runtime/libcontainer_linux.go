package runtime

// This is the only file that imports runc's libcontainer (pinned to v1.5.3 in
// go.mod). Everything else in the package talks to the small container and
// process types below.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime/sessinit"
	"github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // device cgroup support for libcontainer's managers
	devcfg "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	_ "github.com/opencontainers/runc/libcontainer/nsenter" // the C constructor that runs before the Go runtime in "init"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runc/libcontainer/utils"
	"golang.org/x/sys/unix"
)

// InitMain must be the first call in the daemon's main (or an init func). When
// the binary was re-executed by libcontainer as "<argv0> init", it becomes
// "runc init" and never returns; otherwise it returns at once.
func InitMain() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init() // exits the process
	}
	if len(os.Args) > 1 && os.Args[1] == "sessexec" { // a libcontainer exec in a session (seccompload_linux.go)
		os.Exit(sessinit.ExecMain(os.Args[2:]))
	}
}

// sessionCaps is Docker's default capability set: no SYS_ADMIN, so sessions
// cannot mount, pivot or unshare a mount namespace.
var sessionCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW",
	"CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
}

// Docker 20.10's default masked and read-only paths.
var (
	maskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// containerSpec is what the rest of the package decides about a session;
// buildConfig turns it into libcontainer's configuration.
type containerSpec struct {
	id          string
	rootfs      string   // the mounted root overlay
	workspace   string   // bind-mounted at /workspace
	hiddenDirs  []string // masked by a read-only mode-000 tmpfs
	hiddenFiles []string // masked by /dev/null
	limits      Limits
	swap        bool // the kernel accounts swap: limit it together with memory
	// noNewKeyring: keyctl is blocked by the sandbox's seccomp profile.
	noNewKeyring bool
	seccomp      *sessionFilter // nil only in tests
	// preloaded: the session's processes load the precompiled filter
	// themselves (seccompload_linux.go) instead of runc init compiling
	// seccomp for each of them; libcontainer's config then carries none.
	preloaded bool
	net       *netSpec
}

// netSpec is an isolated session's network: the veth peer (in the sandbox's
// netns until libcontainer moves it) becomes eth0 with the session address.
type netSpec struct {
	peer    string
	addr    string // session address, no prefix length
	gateway string // sandbox-side address
}

func buildConfig(cs containerSpec) *configs.Config {
	const dflt = unix.MS_NOEXEC | unix.MS_NOSUID | unix.MS_NODEV
	mounts := []*configs.Mount{
		{Source: "proc", Destination: "/proc", Device: "proc", Flags: dflt},
		{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=65536k"},
		{Source: "devpts", Destination: "/dev/pts", Device: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: dflt, Data: "mode=1777,size=65536k"},
		{Source: "mqueue", Destination: "/dev/mqueue", Device: "mqueue", Flags: dflt},
		{Source: "sysfs", Destination: "/sys", Device: "sysfs", Flags: dflt | unix.MS_RDONLY},
		{Source: "tmpfs", Destination: "/run", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=755,size=65536k"},
		{Source: "tmpfs", Destination: "/tmp", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
		{
			// A slave: what the daemon mounts on Workspace later (the
			// session's overlay, and one in its place) reaches the
			// session; nothing the session mounts reaches back.
			Source: cs.workspace, Destination: "/workspace", Device: "bind", Flags: unix.MS_BIND | unix.MS_REC,
			PropagationFlags: []int{unix.MS_SLAVE | unix.MS_REC},
		},
	}
	for _, h := range cs.hiddenDirs {
		mounts = append(mounts, &configs.Mount{
			Source: "tmpfs", Destination: h, Device: "tmpfs",
			Flags: dflt | unix.MS_RDONLY, Data: "mode=000,size=4k",
		})
	}

	ns := configs.Namespaces{{Type: configs.NEWNS}, {Type: configs.NEWPID}, {Type: configs.NEWIPC}, {Type: configs.NEWUTS}}
	var (
		networks   []*configs.Network
		routes     []*configs.Route
		netDevices map[string]*configs.LinuxNetDevice
	)
	if cs.net != nil {
		ns = append(ns, configs.Namespace{Type: configs.NEWNET})
		networks = []*configs.Network{{Type: "loopback"}}
		// libcontainer moves the peer in (keeping its address) before init
		// runs, so init can add the default route through the sandbox end.
		netDevices = map[string]*configs.LinuxNetDevice{cs.net.peer: {Name: "eth0"}}
		routes = []*configs.Route{{Destination: "0.0.0.0/0", Source: cs.net.addr, Gateway: cs.net.gateway, InterfaceName: "eth0"}}
	}

	devRules := make([]*devcfg.Rule, 0, len(specconv.AllowedDevices))
	for _, d := range specconv.AllowedDevices {
		devRules = append(devRules, &d.Rule)
	}
	pids := cs.limits.pidsMax()
	res := &cgroups.Resources{Devices: devRules, PidsLimit: &pids}
	if m := cs.limits.MemoryBytes; m > 0 {
		res.Memory = m
		if cs.swap {
			res.MemorySwap = m
		}
	}
	res.CpuQuota, res.CpuPeriod = cs.limits.cfsQuota()

	caps := append([]string(nil), sessionCaps...)
	sc := cs.seccomp.config()
	var labels []string
	if cs.preloaded && sc != nil {
		sc, labels = nil, []string{preloadedLabel}
	}
	return &configs.Config{
		Labels: labels,
		Rootfs: cs.rootfs,
		// Mounts made in the sandbox after the session started still reach
		// it; the session's own mounts never reach the sandbox.
		RootPropagation: unix.MS_SLAVE | unix.MS_REC,
		Hostname:        cs.id,
		Namespaces:      ns,
		Networks:        networks,
		Routes:          routes,
		NetDevices:      netDevices,
		Capabilities:    &configs.Capabilities{Bounding: caps, Effective: caps, Permitted: caps},
		NoNewPrivileges: true,
		NoNewKeyring:    cs.noNewKeyring,
		Seccomp:         sc,
		Cgroups: &cgroups.Cgroup{
			// Relative: resolved under the daemon's own cgroup (v1) or next
			// to the daemon's leaf (v2), which is what a nested runtime can write.
			Parent:    "sessions",
			Name:      cs.id,
			Resources: res,
		},
		Devices:       specconv.AllowedDevices,
		Mounts:        mounts,
		MaskPaths:     append(append([]string(nil), maskedPaths...), cs.hiddenFiles...),
		ReadonlyPaths: readonlyPaths,
	}
}

// sessionFilter is the sessions' seccomp filter in libcontainer's form. runc
// init loads it (with no_new_privs, as late as possible: right before it
// execs the session's init or an exec'd process), stacked on the sandbox's
// own filter.
type sessionFilter struct {
	c *configs.Seccomp
}

func (f *sessionFilter) config() *configs.Seccomp {
	if f == nil {
		return nil
	}
	return f.c
}

// flagSpecAllow is runtime-spec's SECCOMP_FILTER_FLAG_SPEC_ALLOW: like runc
// (and so Docker) do by default, do not force the speculative store bypass
// mitigation on every filtered process.
const flagSpecAllow = "SECCOMP_FILTER_FLAG_SPEC_ALLOW"

// newSessionFilter translates f for libcontainer. It fails when the binary
// was built without libseccomp: libcontainer would then refuse to start any
// session with a filter, and a session without one could create user
// namespaces (the sandbox's profile allows unshare for the sandbox's sake).
func newSessionFilter(f *seccompFilter) (*sessionFilter, error) {
	if !seccomp.Enabled {
		return nil, fmt.Errorf("%w: this binary was built without libseccomp, so sessions cannot get their seccomp filter; "+
			"build with CGO_ENABLED=1 -tags 'seccomp osusergo netgo' against libseccomp-dev (scripts/ensure-build-deps.sh)", ErrUnsupported)
	}
	def, err := seccomp.ConvertStringToAction(f.defaultAction)
	if err != nil {
		return nil, fmt.Errorf("session seccomp filter: %w", err)
	}
	c := &configs.Seccomp{DefaultAction: def, DefaultErrnoRet: f.defaultErrnoRet, Syscalls: []*configs.Syscall{}}
	for _, a := range f.arches {
		arch, err := seccomp.ConvertStringToArch(a)
		if err != nil {
			return nil, fmt.Errorf("session seccomp filter: %w", err)
		}
		c.Architectures = append(c.Architectures, arch)
	}
	if seccomp.FlagSupported(flagSpecAllow) == nil {
		c.Flags = append(c.Flags, flagSpecAllow)
	}
	for _, r := range f.rules {
		act, err := seccomp.ConvertStringToAction(r.action)
		if err != nil {
			return nil, fmt.Errorf("session seccomp filter: %v: %w", r.names, err)
		}
		args := make([]*configs.Arg, 0, len(r.args))
		for _, a := range r.args {
			op, err := seccomp.ConvertStringToOperator(a.Op)
			if err != nil {
				return nil, fmt.Errorf("session seccomp filter: %v: %w", r.names, err)
			}
			args = append(args, &configs.Arg{Index: a.Index, Value: a.Value, ValueTwo: a.ValueTwo, Op: op})
		}
		for _, name := range r.names {
			c.Syscalls = append(c.Syscalls, &configs.Syscall{Name: name, Action: act, ErrnoRet: r.errnoRet, Args: args})
		}
	}
	return &sessionFilter{c: c}, nil
}

// container is a created or loaded libcontainer container.
type container struct {
	c *libcontainer.Container
}

func createContainer(root string, cs containerSpec) (*container, error) {
	c, err := libcontainer.Create(root, cs.id, buildConfig(cs))
	if errors.Is(err, libcontainer.ErrExist) {
		return nil, fmt.Errorf("%w: %s", ErrExists, cs.id)
	}
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	return &container{c: c}, nil
}

// loadContainer re-attaches to a container's saved state. running is false
// when its init is gone (the container is then stopped and can only be
// destroyed).
func loadContainer(root, id string) (_ *container, running bool, _ error) {
	c, err := libcontainer.Load(root, id)
	if err != nil {
		if errors.Is(err, libcontainer.ErrNotExist) {
			return nil, false, fmt.Errorf("%w: no container state for %s", ErrGone, id)
		}
		return nil, false, fmt.Errorf("load container: %w", err)
	}
	st, err := c.Status()
	if err != nil {
		return nil, false, fmt.Errorf("container status: %w", err)
	}
	if st == libcontainer.Paused {
		// The daemon died while the session was frozen for a capture.
		if err := c.Resume(); err != nil {
			return nil, false, fmt.Errorf("thaw session left frozen: %w", err)
		}
		st = libcontainer.Running
	}
	return &container{c: c}, st == libcontainer.Running, nil
}

// pause freezes every process of the container (the freezer cgroup on v1,
// cgroup.freeze on v2).
func (c *container) pause() error {
	if err := c.c.Pause(); err != nil {
		return fmt.Errorf("freeze session: %w", err)
	}
	return nil
}

// resume thaws a paused container; one that is not paused is left alone.
func (c *container) resume() error {
	err := c.c.Resume()
	if err == nil || errors.Is(err, libcontainer.ErrNotPaused) {
		return nil
	}
	return fmt.Errorf("thaw session: %w", err)
}

// paused reports whether the container is frozen.
func (c *container) paused() bool {
	st, err := c.c.Status()
	return err == nil && st == libcontainer.Paused
}

// procIO is a process's stdio as the kernel sees it: files only, so that
// libcontainer's exec.Cmd starts no copying goroutines of its own.
type procIO struct {
	stdin, stdout, stderr *os.File
	extra                 []*os.File // fd 3 onwards
	tty                   bool
	rows, cols            uint16
}

type procArgs struct {
	args []string
	env  []string
	cwd  string
	io   procIO
}

// process is a started libcontainer process.
type process struct {
	p   *libcontainer.Process
	pid int
	pty *os.File // the pty master, when a TTY was requested
}

// run starts args in the container: the session's init when init is true,
// otherwise an additional process (setns into the namespaces and cgroup).
func (c *container) run(a procArgs, init bool) (*process, error) {
	p := &libcontainer.Process{
		Args: a.args, Env: a.env, Cwd: a.cwd, Init: init,
		ExtraFiles: a.io.extra,
	}
	// A nil *os.File must stay a nil io.Reader/io.Writer: exec.Cmd then
	// opens /dev/null instead of failing on a typed nil.
	if a.io.stdin != nil {
		p.Stdin = a.io.stdin
	}
	if a.io.stdout != nil {
		p.Stdout = a.io.stdout
	}
	if a.io.stderr != nil {
		p.Stderr = a.io.stderr
	}
	var consoleParent *os.File
	if a.io.tty {
		parent, child, err := utils.NewSockPair("console")
		if err != nil {
			return nil, fmt.Errorf("console socket: %w", err)
		}
		defer child.Close()
		consoleParent = parent
		defer consoleParent.Close()
		p.ConsoleSocket = child
		p.ConsoleWidth, p.ConsoleHeight = a.io.cols, a.io.rows
	}
	if err := c.c.Run(p); err != nil {
		return nil, fmt.Errorf("start process %q: %w", a.args[0], err)
	}
	pid, err := p.Pid()
	if err != nil {
		return nil, fmt.Errorf("process pid: %w", err)
	}
	proc := &process{p: p, pid: pid}
	if consoleParent != nil {
		// runc init sent the master before it exec'd, so it is queued.
		//lint:ignore SA1019 runc 1.5's public API; cmsg.RecvFile is internal to runc
		master, err := utils.RecvFile(consoleParent)
		if err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			_, _ = p.Wait()
			return nil, fmt.Errorf("receive pty master: %w", err)
		}
		proc.pty = master
	}
	return proc, nil
}

// wait waits for the process and returns its exit code, or -signal when a
// signal killed it.
func (p *process) wait() (int, error) {
	st, err := p.p.Wait()
	if st == nil {
		return 0, fmt.Errorf("wait for pid %d: %w", p.pid, err)
	}
	return exitCode(st), nil
}

func exitCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -int(ws.Signal())
	}
	return st.ExitCode()
}

// filtered reports whether the container's processes get a seccomp filter
// of their own (false for sessions started by a daemon built before sessions
// had one).
func (c *container) filtered() bool {
	return c.c.Config().Seccomp != nil || c.preloaded()
}

// preloadedLabel marks a container whose processes load the daemon's
// precompiled filter themselves.
const preloadedLabel = "eos.seccomp=preloaded"

// preloaded reports whether every process started in the container must be
// started through the precompiled filter (sessexec).
func (c *container) preloaded() bool {
	return slices.Contains(c.c.Config().Labels, preloadedLabel)
}

func (c *container) running() bool {
	st, err := c.c.Status()
	return err == nil && st == libcontainer.Running
}

// kill sends SIGKILL to the session's init, which makes the kernel kill every
// process in its pid namespace. A stopped container is not an error.
func (c *container) kill() error {
	err := c.c.Signal(unix.SIGKILL)
	if err == nil || errors.Is(err, libcontainer.ErrNotRunning) {
		return nil
	}
	if !c.running() {
		return nil
	}
	return fmt.Errorf("kill session init: %w", err)
}

// destroy removes the cgroup and the state dir of a stopped container.
func (c *container) destroy() error {
	// The cgroup may still list processes for a moment after init died
	// (the kernel tears the pid namespace down asynchronously).
	var err error
	for range 50 {
		if err = c.c.Destroy(); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("destroy container: %w", err)
}

// initZombie returns the pid of the container's init when it is a zombie
// that is still the process libcontainer recorded (same start time), so it
// can be reaped without stealing a recycled pid's status.
func (c *container) initZombie() (int, bool) {
	st, err := c.c.State()
	if err != nil || st.InitProcessPid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", st.InitProcessPid))
	if err != nil {
		return 0, false
	}
	// Fields after the parenthesised command: state is the 1st, starttime the 20th.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || f[0] != "Z" || f[19] != strconv.FormatUint(st.InitProcessStartTime, 10) {
		return 0, false
	}
	return st.InitProcessPid, true
}

func (c *container) initPid() (int, error) {
	st, err := c.c.State()
	if err != nil {
		return 0, fmt.Errorf("container state: %w", err)
	}
	return st.InitProcessPid, nil
}

// pids lists the session's processes (pids in the sandbox's pid namespace).
func (c *container) pids() ([]int, error) {
	pids, err := c.c.Processes()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	return pids, nil
}

// cgroupPaths maps controller (v1) or "" (v2) to the session's cgroup dir.
func (c *container) cgroupPaths() (map[string]string, error) {
	st, err := c.c.State()
	if err != nil {
		return nil, fmt.Errorf("container state: %w", err)
	}
	return st.CgroupPaths, nil
}

// listContainers returns the ids that have libcontainer state under root.
func listContainers(root string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(root, e.Name(), "state.json")); err == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
