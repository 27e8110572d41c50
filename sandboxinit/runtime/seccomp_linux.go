package runtime

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sandboxProfile is seccomp.json: the profile the sandbox container is
// created with (Docker 20.10's default plus, for a holder of CAP_SYS_ADMIN,
// what nested libcontainer needs; minus io_uring_setup, io_uring_enter and
// io_uring_register, which Docker's default refuses since 25.0: io_uring
// performs I/O the filter never sees). Sessions get a filter derived from it.
//
//go:embed seccomp.json
var sandboxProfile []byte

// seccompSetup is what the sandbox's seccomp profile allows, and the filter
// sessions run under.
type seccompSetup struct {
	// noNewKeyring: keyctl is blocked (Docker's default profile), so sessions
	// must not try to create their own session keyring. runc init makes that
	// call under the sandbox's filter, before the session's own is loaded.
	noNewKeyring bool
	// session is every session's own filter (see sessionSeccomp), loaded by
	// runc init right before it execs the session's init or an exec'd
	// process; the fast exec path inherits it from the session init.
	session *sessionFilter
	// compiled is session's program, compiled once (seccompbpf_linux.go),
	// as the sealed memfd every session init and libcontainer exec loads.
	compiled *os.File
}

// checkSeccomp probes the syscalls Docker's default profile blocks and
// sessions need. pivot_root is required: its alternative (MS_MOVE plus
// chroot) is escapable by a session holding SYS_CHROOT. keyctl is optional.
// Call it only after checkCaps: without SYS_ADMIN pivot_root fails anyway.
// It also builds the sessions' filter, which needs a binary built with
// libseccomp (build tag seccomp).
func checkSeccomp() (seccompSetup, error) {
	var s seccompSetup
	// A path that does not exist: allowed gives ENOENT, a filter gives EPERM.
	err := unix.PivotRoot("/nonexistent-eos-probe", "/nonexistent-eos-probe")
	if errors.Is(err, unix.EPERM) {
		return s, fmt.Errorf("%w: seccomp blocks pivot_root; create the sandbox with "+
			"--security-opt seccomp=<sandboxinit/runtime/seccomp.json> (Docker's default plus pivot_root, keyctl, add_key, request_key)", ErrUnsupported)
	}
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	s.noNewKeyring = errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS)

	kernel, err := kernelVersion()
	if err != nil {
		return s, err
	}
	f, err := sessionSeccomp(sandboxProfile, goruntime.GOARCH, kernel, sessionCaps)
	if err != nil {
		return s, err
	}
	if s.session, err = newSessionFilter(f); err != nil {
		return s, err
	}
	prog, err := compileFilter(s.session.config())
	if err != nil {
		return s, err
	}
	if s.compiled, err = prog.Memfd(); err != nil {
		return s, err
	}
	return s, nil
}

// dockerProfile is the part of Docker's seccomp profile format (moby's
// profiles/seccomp.Seccomp) that seccomp.json uses.
type dockerProfile struct {
	DefaultAction   string   `json:"defaultAction"`
	DefaultErrnoRet *uint    `json:"defaultErrnoRet"`
	Architectures   []string `json:"architectures"`
	ArchMap         []struct {
		Arch      string   `json:"architecture"`
		SubArches []string `json:"subArchitectures"`
	} `json:"archMap"`
	Syscalls []struct {
		Name     string       `json:"name"`
		Names    []string     `json:"names"`
		Action   string       `json:"action"`
		ErrnoRet *uint        `json:"errnoRet"`
		Args     []seccompArg `json:"args"`
		Includes dockerFilter `json:"includes"`
		Excludes dockerFilter `json:"excludes"`
	} `json:"syscalls"`
}

// dockerFilter is a rule's includes or excludes: Go arch names (GOARCH),
// capabilities ("CAP_SYS_ADMIN") and a kernel version ("4.8").
type dockerFilter struct {
	Arches    []string `json:"arches"`
	Caps      []string `json:"caps"`
	MinKernel string   `json:"minKernel"`
}

// seccompFilter is a profile resolved for one process: every rule applies.
// Strings are libseccomp's names (SCMP_ACT_*, SCMP_ARCH_*, SCMP_CMP_*).
type seccompFilter struct {
	defaultAction   string
	defaultErrnoRet *uint
	arches          []string
	rules           []seccompRule
}

type seccompRule struct {
	names    []string
	action   string
	errnoRet *uint
	args     []seccompArg // all must match
}

type seccompArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

// nativeToSeccomp maps GOARCH to libseccomp's name for the archMap lookup.
var nativeToSeccomp = map[string]string{
	"amd64": "SCMP_ARCH_X86_64", "386": "SCMP_ARCH_X86", "arm64": "SCMP_ARCH_AARCH64", "arm": "SCMP_ARCH_ARM",
	"mips64": "SCMP_ARCH_MIPS64", "mips64le": "SCMP_ARCH_MIPSEL64", "mips": "SCMP_ARCH_MIPS", "mipsle": "SCMP_ARCH_MIPSEL",
	"ppc64": "SCMP_ARCH_PPC64", "ppc64le": "SCMP_ARCH_PPC64LE", "riscv64": "SCMP_ARCH_RISCV64",
	"s390x": "SCMP_ARCH_S390X", "loong64": "SCMP_ARCH_LOONGARCH64",
}

// sessionSeccomp resolves a Docker seccomp profile for a process with the
// bounding set caps on arch (GOARCH) and the kernel "major.minor", exactly as
// Docker does for a container (moby profiles/seccomp setupSeccomp): a rule
// is dropped when an excluded arch matches, an excluded capability is held
// or the kernel reaches the excluded version, and when an included arch does
// not match, an included capability is missing or the kernel is older than
// the included version.
//
// For sessions (no SYS_ADMIN, no SYS_PTRACE, no SYS_MODULE, ...) that is
// Docker's default filter for an unprivileged container: unshare, setns,
// mount, umount2, pivot_root, clone with namespace flags, bpf, keyctl and
// the other key syscalls, perf_event_open, module and kexec syscalls,
// open_by_handle_at, userfaultfd, the io_uring syscalls and every syscall
// not named fail with EPERM;
// clone3 fails with ENOSYS so that libcs fall back to clone; ptrace is
// allowed (kernel >= 4.8).
func sessionSeccomp(profile []byte, arch string, kernel [2]int, caps []string) (*seccompFilter, error) {
	var p dockerProfile
	if err := json.Unmarshal(profile, &p); err != nil {
		return nil, fmt.Errorf("parse seccomp profile: %w", err)
	}
	if p.DefaultAction == "" {
		return nil, errors.New("seccomp profile: no defaultAction")
	}
	if len(p.Architectures) > 0 && len(p.ArchMap) > 0 {
		return nil, errors.New("seccomp profile: both architectures and archMap")
	}
	f := &seccompFilter{defaultAction: p.DefaultAction, defaultErrnoRet: p.DefaultErrnoRet}
	f.arches = append(f.arches, p.Architectures...)
	if native, ok := nativeToSeccomp[arch]; ok {
		for _, a := range p.ArchMap {
			if a.Arch == native {
				f.arches = append(append(f.arches, a.Arch), a.SubArches...)
				break
			}
		}
	}
	// Sessions leave out the x32 ABI: distribution kernels disable it, and
	// every extra architecture costs runc about 7 ms per exec to compile.
	f.arches = slices.DeleteFunc(f.arches, func(a string) bool { return a == "SCMP_ARCH_X32" })
	atLeast := func(v string) (bool, error) {
		want, err := parseKernelVersion(v)
		if err != nil {
			return false, fmt.Errorf("seccomp profile: minKernel %q: %w", v, err)
		}
		return kernel[0] > want[0] || kernel[0] == want[0] && kernel[1] >= want[1], nil
	}
	held := func(c string) bool { return slices.Contains(caps, c) }
rules:
	for _, r := range p.Syscalls {
		names := r.Names
		if r.Name != "" {
			if len(names) > 0 {
				return nil, fmt.Errorf("seccomp profile: rule for %q has both name and names", r.Name)
			}
			names = []string{r.Name}
		}
		ex, in := r.Excludes, r.Includes
		if slices.Contains(ex.Arches, arch) || slices.ContainsFunc(ex.Caps, held) {
			continue
		}
		if ex.MinKernel != "" {
			ok, err := atLeast(ex.MinKernel)
			if err != nil {
				return nil, err
			}
			if ok {
				continue
			}
		}
		if len(in.Arches) > 0 && !slices.Contains(in.Arches, arch) {
			continue
		}
		for _, c := range in.Caps {
			if !held(c) {
				continue rules
			}
		}
		if in.MinKernel != "" {
			ok, err := atLeast(in.MinKernel)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
		}
		if r.Action == "" || len(names) == 0 {
			return nil, fmt.Errorf("seccomp profile: rule %v without action or names", names)
		}
		f.rules = append(f.rules, seccompRule{names: names, action: r.Action, errnoRet: r.ErrnoRet, args: r.Args})
	}
	return f, nil
}

// kernelVersion returns the running kernel's major and minor version.
func kernelVersion() ([2]int, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return [2]int{}, fmt.Errorf("uname: %w", err)
	}
	v, err := parseKernelVersion(unix.ByteSliceToString(u.Release[:]))
	if err != nil {
		return v, fmt.Errorf("kernel release: %w", err)
	}
	return v, nil
}

// parseKernelVersion reads "major.minor" from "6.1", "4.8.0" or
// "6.18.44-foo".
func parseKernelVersion(s string) ([2]int, error) {
	major, rest, ok := strings.Cut(s, ".")
	if !ok {
		return [2]int{}, fmt.Errorf("%q is not major.minor", s)
	}
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		rest = rest[:i]
	}
	a, err1 := strconv.Atoi(major)
	b, err2 := strconv.Atoi(rest)
	if err1 != nil || err2 != nil {
		return [2]int{}, fmt.Errorf("%q is not major.minor", s)
	}
	return [2]int{a, b}, nil
}
