package runtime

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// Sentinel errors. Callers match them with errors.Is.
var (
	// ErrInvalidSpec reports a SessionSpec or ProcSpec the runtime refuses.
	ErrInvalidSpec = errors.New("invalid session spec")
	// ErrExists reports a Start for an id whose container already exists.
	ErrExists = errors.New("session already exists")
	// ErrGone reports that a session's init is no longer running (Load) or
	// that the session was destroyed (Exec).
	ErrGone = errors.New("session is gone")
	// ErrUnsupported reports an environment that lacks something a feature
	// needs (a capability, a writable cgroup, NET_ADMIN for isolated sessions).
	ErrUnsupported = errors.New("unsupported environment")
)

// DefaultPidsMax is the pids.max of a session when Limits.PidsMax is 0. The
// Go session init alone uses about six of them (its threads count).
const DefaultPidsMax = 1024

// Bounds of Limits. MaxPidsMax is the kernel's PID_MAX_LIMIT (pids.max
// takes nothing larger); MinMemoryBytes leaves room for the session's init;
// MaxCPUs is a fixed bound, not this machine's core count, so that every
// door checks the same value whatever the sandbox runs on (a quota above
// the cores there is no limit, as 0 is).
const (
	MaxPidsMax     = 4 << 20
	MinMemoryBytes = 8 << 20
	MaxCPUs        = 1024
)

// Limits are a session's cgroup limits.
type Limits struct {
	PidsMax     int64   // 0 = DefaultPidsMax; at most MaxPidsMax
	MemoryBytes int64   // 0 = no limit, else at least MinMemoryBytes; swap is limited to the same value where the kernel accounts swap
	CPUs        float64 // 0 = no limit, else finite, above 0, at most MaxCPUs; 1.5 = one and a half cores (cfs quota over a 100 ms period; at least 1 ms of it)
}

// LimitError refuses one field of a Limits (named as on the wire:
// pids_max, memory_bytes, cpus). It matches ErrInvalidSpec.
type LimitError struct {
	Field  string
	Reason string
}

func (e *LimitError) Error() string { return fmt.Sprintf("%s %s", e.Field, e.Reason) }

func (e *LimitError) Unwrap() error { return ErrInvalidSpec }

// Check refuses limits the runtime cannot apply as asked (a *LimitError):
// callers check them before they make anything for the session.
func (l Limits) Check() error {
	bad := func(field, format string, args ...any) error {
		return &LimitError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case l.PidsMax < 0:
		return bad("pids_max", "must not be negative (0: the default, %d), not %d", DefaultPidsMax, l.PidsMax)
	case l.PidsMax > MaxPidsMax:
		return bad("pids_max", "must be at most %d (the kernel's PID_MAX_LIMIT), not %d", MaxPidsMax, l.PidsMax)
	case l.MemoryBytes < 0:
		return bad("memory_bytes", "must not be negative (0: no limit), not %d", l.MemoryBytes)
	case l.MemoryBytes > 0 && l.MemoryBytes < MinMemoryBytes:
		return bad("memory_bytes", "%d is below 8 MiB (%d; 0: no limit)", l.MemoryBytes, MinMemoryBytes)
	case math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0):
		return bad("cpus", "must be a finite number, not %v", l.CPUs)
	case l.CPUs < 0:
		return bad("cpus", "must not be negative (0: no limit), not %v", l.CPUs)
	case l.CPUs > MaxCPUs:
		return bad("cpus", "must be at most %d, not %v", MaxCPUs, l.CPUs)
	}
	return nil
}

// SessionSpec describes one session. The caller keeps it and passes the same
// spec to Load after a daemon restart.
type SessionSpec struct {
	ID        string   // [a-z0-9-]{1,64}
	Dir       string   // per-session state dir on the state volume; the runtime uses Dir/root (upper, work, merged) and Dir/init.log
	Workspace string   // host path of a directory that becomes /workspace (bind, rec-slave: mounts made on it after the start reach the session)
	Isolated  bool     // own network namespace: loopback plus eth0, a veth to the sandbox; false = share the sandbox's network
	Addr      string   // isolated only, optional: the session's IPv4 address (as IP() returned it) to keep it stable across restarts
	Egress    Egress   // isolated only: what the session may reach (zero = the sandbox and beyond, never other sessions)
	Limits    Limits   // cgroup limits
	Hidden    []string // host paths masked inside the session: dirs by a read-only mode-000 tmpfs, files by /dev/null
	InitPath  string   // the session's PID 1 (cmd/sandbox-sessinit, or the daemon binary with InitArgs "sessinit"), opened in the sandbox and started by descriptor
	InitArgs  []string // arguments after InitPath
	Env       []string // extra environment for the init and every exec (defaults: PATH, HOME=/root)
}

// idPattern is compiled on first use, not at init: this package runs in
// every runc init, and the {1,64} compiles to a program of 700 allocations
// (0.36 ms).
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9-]{1,64}$`) })

// validate checks what would otherwise fail late and obscurely: overlay
// options cannot carry commas or colons, libcontainer needs absolute paths.
func (s *SessionSpec) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))
	}
	if !idPattern().MatchString(s.ID) {
		return bad("id %q does not match [a-z0-9-]{1,64}", s.ID)
	}
	for name, p := range map[string]string{"dir": s.Dir, "workspace": s.Workspace, "init path": s.InitPath} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return bad("%s %q must be a clean absolute path", name, p)
		}
	}
	if strings.ContainsAny(s.Dir, ",:") {
		return bad("dir %q must not contain ',' or ':' (overlay options)", s.Dir)
	}
	for _, h := range s.Hidden {
		if !filepath.IsAbs(h) || filepath.Clean(h) != h || h == "/" {
			return bad("hidden path %q must be a clean absolute path other than /", h)
		}
		if systemPath(h) {
			return bad("hidden path %q overlaps a path the session needs", h)
		}
		if hasPathPrefix(s.InitPath, h) {
			return bad("init path %q is under hidden path %q", s.InitPath, h)
		}
	}
	if err := s.Limits.Check(); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if s.Addr != "" {
		if !s.Isolated {
			return bad("addr %q given for a shared-network session", s.Addr)
		}
		if _, err := subnetOf(s.Addr); err != nil {
			return bad("addr: %v", err)
		}
	}
	if !s.Egress.isDefault() && !s.Isolated {
		return bad("an egress policy needs an isolated session (a shared one uses the sandbox's network)")
	}
	if s.Egress.None && len(s.Egress.Allow) > 0 {
		return bad("egress none with an allow-list")
	}
	for _, r := range s.Egress.Allow {
		if !r.Prefix.IsValid() || !r.Prefix.Addr().Is4() || r.Port == 0 {
			return bad("egress rule %v: want an IPv4 prefix and a port", r)
		}
	}
	return nil
}

// systemPath reports whether p is, or is under, a mount the session's
// configuration itself provides; masking it would break the session.
func systemPath(p string) bool {
	for _, sys := range []string{"/proc", "/sys", "/dev", "/workspace"} {
		if hasPathPrefix(p, sys) {
			return true
		}
	}
	return false
}

// pidsMax is the effective pids.max.
func (l Limits) pidsMax() int64 {
	if l.PidsMax == 0 {
		return DefaultPidsMax
	}
	return l.PidsMax
}

// cfsQuota converts CPUs to a cfs quota and period in microseconds; 0, 0
// means no limit.
func (l Limits) cfsQuota() (quota int64, period uint64) {
	if l.CPUs == 0 {
		return 0, 0
	}
	const periodUS = 100_000
	q := int64(l.CPUs * periodUS)
	if q < 1000 { // the kernel's minimum quota is 1 ms
		q = 1000
	}
	return q, periodUS
}

// addrPrefix is the pool isolated sessions' /30 subnets come from.
var addrPrefix = netip.MustParsePrefix("10.200.0.0/16")

// subnet is one /30 of addrPrefix: the sandbox end is .1, the session .2.
type subnet struct{ index int }

const subnetCount = 1 << (32 - 16 - 2)

func (s subnet) base() netip.Addr {
	b := addrPrefix.Addr().As4()
	off := s.index * 4
	b[2] += byte(off >> 8)
	b[3] += byte(off)
	return netip.AddrFrom4(b)
}

// Gateway is the sandbox-side address of the veth pair.
func (s subnet) gateway() netip.Addr { return s.base().Next() }

// session is the session-side address.
func (s subnet) session() netip.Addr { return s.base().Next().Next() }

// subnetOf maps a session address back to its subnet.
func subnetOf(addr string) (subnet, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return subnet{}, err
	}
	if !a.Is4() || !addrPrefix.Contains(a) {
		return subnet{}, fmt.Errorf("%s is not in %s", addr, addrPrefix)
	}
	b := a.As4()
	off := int(b[2])<<8 | int(b[3])
	if off%4 != 2 {
		return subnet{}, fmt.Errorf("%s is not the session address (.2) of a /30", addr)
	}
	return subnet{index: off / 4}, nil
}
