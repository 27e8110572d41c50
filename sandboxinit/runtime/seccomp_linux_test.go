package runtime

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// allowedBy returns, per syscall name, the rules of f that allow it.
func allowedBy(f *seccompFilter) map[string][]seccompRule {
	m := map[string][]seccompRule{}
	for _, r := range f.rules {
		if r.action != "SCMP_ACT_ALLOW" {
			continue
		}
		for _, n := range r.names {
			m[n] = append(m[n], r)
		}
	}
	return m
}

// blockedForSessions are what Docker's default profile denies a container
// without CAP_SYS_ADMIN (and the other capabilities sessions lack).
var blockedForSessions = []string{
	"unshare", "setns", "mount", "umount", "umount2", "pivot_root", "mount_setattr", "move_mount", "open_tree",
	"fsopen", "fsconfig", "fsmount", "fspick", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at",
	"name_to_handle_at", "userfaultfd", "quotactl", "syslog", "sethostname", "setdomainname", "lookup_dcookie",
	"fanotify_init", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "iopl", "ioperm", "reboot",
	"acct", "settimeofday", "clock_settime", "vhangup", "mbind", "set_mempolicy", "nfsservctl", "swapon", "swapoff",
	"io_uring_setup", "io_uring_enter", "io_uring_register", // refused by Docker's default since 25.0
}

func TestSessionSeccomp(t *testing.T) {
	f, err := sessionSeccomp(sandboxProfile, "amd64", [2]int{6, 1}, sessionCaps)
	require.NoError(t, err)
	require.Equal(t, "SCMP_ACT_ERRNO", f.defaultAction)
	require.Nil(t, f.defaultErrnoRet, "EPERM, libcontainer's default")
	require.Equal(t, []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86"}, f.arches)

	allowed := allowedBy(f)
	for _, name := range blockedForSessions {
		require.NotContains(t, allowed, name, "sessions must not get %s", name)
	}
	for _, name := range []string{
		"read", "write", "openat", "execve", "futex", "wait4", "socket", "mmap", "mprotect", "pipe2", "rt_sigaction",
		"ptrace",     // Docker >= 19.03 on kernels >= 4.8
		"chroot",     // sessions keep SYS_CHROOT
		"arch_prctl", // amd64 only
		"personality", "seccomp", "prctl", "setuid", "setgroups", "pidfd_open",
	} {
		require.Contains(t, allowed, name)
	}
	// clone only without namespace flags, clone3 with ENOSYS so that libcs
	// fall back to clone.
	require.Len(t, allowed["clone"], 1)
	require.Equal(t, []seccompArg{{Index: 0, Value: 0x7E020000, Op: "SCMP_CMP_MASKED_EQ"}}, allowed["clone"][0].args)
	var clone3 []seccompRule
	for _, r := range f.rules {
		if r.names[0] == "clone3" {
			clone3 = append(clone3, r)
		}
	}
	require.Len(t, clone3, 1)
	require.Equal(t, "SCMP_ACT_ERRNO", clone3[0].action)
	require.Equal(t, uint(unix.ENOSYS), *clone3[0].errnoRet)
	for _, r := range f.rules {
		if len(r.args) == 0 && r.action == "SCMP_ACT_ALLOW" {
			require.NotContains(t, r.names, "personality", "personality is allowed for a few arguments only")
		}
	}

	// Old kernels: no ptrace (Docker's minKernel rule).
	old, err := sessionSeccomp(sandboxProfile, "amd64", [2]int{4, 4}, sessionCaps)
	require.NoError(t, err)
	require.NotContains(t, allowedBy(old), "ptrace")

	// Another arch: its own archMap entry and arch rules.
	arm, err := sessionSeccomp(sandboxProfile, "arm64", [2]int{6, 1}, sessionCaps)
	require.NoError(t, err)
	require.Equal(t, []string{"SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"}, arm.arches)
	require.NotContains(t, allowedBy(arm), "arch_prctl")
	require.Contains(t, allowedBy(arm), "set_tls")
}

// The same derivation for the sandbox (which holds SYS_ADMIN) reproduces what
// Docker gives it: nested libcontainer's syscalls are allowed there.
func TestSandboxSeccompDerivation(t *testing.T) {
	sandbox := append([]string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN"}, sessionCaps...)
	f, err := sessionSeccomp(sandboxProfile, "amd64", [2]int{6, 1}, sandbox)
	require.NoError(t, err)
	allowed := allowedBy(f)
	for _, name := range []string{"pivot_root", "keyctl", "add_key", "request_key", "mount", "unshare", "setns", "clone", "clone3"} {
		require.Contains(t, allowed, name)
	}
	require.Empty(t, allowed["clone"][0].args, "with SYS_ADMIN clone is unconditional")
	for _, name := range []string{"kexec_load", "init_module", "open_by_handle_at", "userfaultfd", "process_vm_readv",
		"io_uring_setup", "io_uring_enter", "io_uring_register"} {
		require.NotContains(t, allowed, name)
	}
}

// TestSeccompRefusesIOUring: no rule of the profile, for any architecture,
// capability or kernel, allows an io_uring syscall (current Docker's default
// profile refuses all three), so neither the sandbox nor a session gets one.
func TestSeccompRefusesIOUring(t *testing.T) {
	var p dockerProfile
	require.NoError(t, json.Unmarshal(sandboxProfile, &p))
	for _, r := range p.Syscalls {
		for _, n := range append([]string{r.Name}, r.Names...) {
			require.NotContains(t, []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}, n,
				"a %s rule names %s", r.Action, n)
		}
	}
	for _, caps := range [][]string{sessionCaps, append([]string{"CAP_SYS_ADMIN"}, sessionCaps...)} {
		f, err := sessionSeccomp(sandboxProfile, "amd64", [2]int{6, 18}, caps)
		require.NoError(t, err)
		require.Equal(t, "SCMP_ACT_ERRNO", f.defaultAction, "what no rule names is refused")
		allowed := allowedBy(f)
		for _, n := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register"} {
			require.NotContains(t, allowed, n)
		}
	}
}

func TestSessionSeccompProfileErrors(t *testing.T) {
	for _, tc := range []struct{ name, profile, wantErr string }{
		{"not json", `{`, "parse seccomp profile"},
		{"no default", `{"syscalls": []}`, "no defaultAction"},
		{"both arch forms", `{"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64"],
			"archMap": [{"architecture": "SCMP_ARCH_X86_64"}]}`, "both architectures and archMap"},
		{"name and names", `{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"name": "a", "names": ["b"], "action": "SCMP_ACT_ALLOW"}]}`, "both name and names"},
		{"bad kernel", `{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["a"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "x"}}]}`, "minKernel"},
		{"no action", `{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["a"]}]}`, "without action"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sessionSeccomp([]byte(tc.profile), "amd64", [2]int{6, 1}, sessionCaps)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
	f, err := sessionSeccomp([]byte(`{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
		{"name": "a", "action": "SCMP_ACT_ALLOW", "excludes": {"minKernel": "5.0"}},
		{"name": "b", "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["amd64"]}},
		{"name": "c", "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_CHOWN", "CAP_KILL"]}},
		{"name": "d", "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}}]}`),
		"amd64", [2]int{4, 19}, sessionCaps)
	require.NoError(t, err)
	var names []string
	for _, r := range f.rules {
		names = append(names, r.names...)
	}
	require.Equal(t, []string{"a", "c"}, names, "every included cap must be held")
}

func TestParseKernelVersion(t *testing.T) {
	for in, want := range map[string][2]int{"4.8": {4, 8}, "6.18.44-fc-v669": {6, 18}, "5.10.0-28-amd64": {5, 10}, "6.1+": {6, 1}} {
		got, err := parseKernelVersion(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "6", "a.b", ".1"} {
		_, err := parseKernelVersion(in)
		require.Error(t, err, in)
	}
	v, err := kernelVersion()
	require.NoError(t, err)
	require.Positive(t, v[0])
}

// newSessionFilter needs libseccomp (build tag seccomp); without it the
// runtime must refuse rather than run sessions unfiltered.
func TestNewSessionFilter(t *testing.T) {
	f, err := sessionSeccomp(sandboxProfile, "amd64", [2]int{6, 1}, sessionCaps)
	require.NoError(t, err)
	sf, err := newSessionFilter(f)
	if errors.Is(err, ErrUnsupported) {
		// Built without the seccomp tag: the refusal is what there is to
		// test here; `make test` also runs this package with the tag.
		require.ErrorContains(t, err, "built without libseccomp")
		return
	}
	require.NoError(t, err)
	c := sf.config()
	require.Equal(t, []string{"amd64", "x86"}, c.Architectures, "sessions leave out x32")
	cfg := buildConfig(containerSpec{id: "s", rootfs: "/r", workspace: "/w", seccomp: sf})
	require.Same(t, c, cfg.Seccomp)
	n := 0
	for _, s := range c.Syscalls {
		require.NotContains(t, blockedForSessions, s.Name)
		if s.Name == "clone" {
			n++
			require.Len(t, s.Args, 1)
		}
	}
	require.Equal(t, 1, n)
	_, err = newSessionFilter(&seccompFilter{defaultAction: "SCMP_ACT_NOPE"})
	require.Error(t, err)
}
