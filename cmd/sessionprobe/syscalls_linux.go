package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// syscallProbes are raw syscalls a session's seccomp filter decides on, each
// with arguments that cannot do harm: where the kernel would answer
// differently without a filter (ENOENT, EBADF, EFAULT, EINVAL, success), the
// result shows whether the filter or the missing capability said no.
var syscallProbes = []struct {
	name string
	call func() error
}{
	{"unshare_newuser", func() error { return unix.Unshare(unix.CLONE_NEWUSER) }},
	{"unshare_none", func() error { return unix.Unshare(0) }}, // Docker blocks unshare altogether
	{"clone_newuser", func() error { return forkNoop(unix.CLONE_NEWUSER) }},
	{"clone_newns", func() error { return forkNoop(unix.CLONE_NEWNS) }},
	{"clone3", func() error { return raw(unix.SYS_CLONE3, 0, 0) }}, // no args: EINVAL if allowed
	{"setns", func() error { return unix.Setns(-1, 0) }},
	{"mount", func() error { return unix.Mount("none", "/nonexistent-eos-probe", "tmpfs", 0, "") }},
	{"umount2", func() error { return unix.Unmount("/nonexistent-eos-probe", 0) }},
	{"pivot_root", func() error { return unix.PivotRoot("/nonexistent-eos-probe", "/nonexistent-eos-probe") }},
	{"fsopen", func() error { return raw(unix.SYS_FSOPEN, 0, 0) }},
	{"keyctl", func() error {
		_, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
		return err
	}},
	{"add_key", func() error { return raw(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0) }},
	{"request_key", func() error { return raw(unix.SYS_REQUEST_KEY, 0, 0, 0, 0) }},
	{"bpf", func() error { return raw(unix.SYS_BPF, 0xffff, 0, 0) }},
	{"perf_event_open", func() error { return raw(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0) }},
	{"init_module", func() error { return raw(unix.SYS_INIT_MODULE, 0, 0, 0) }},
	{"finit_module", func() error { return raw(unix.SYS_FINIT_MODULE, ^uintptr(0), 0, 0) }},
	{"delete_module", func() error { return raw(unix.SYS_DELETE_MODULE, 0, 0) }},
	{"kexec_load", func() error { return raw(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0) }},
	{"open_by_handle_at", func() error { return raw(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0) }},
	{"name_to_handle_at", func() error { return raw(unix.SYS_NAME_TO_HANDLE_AT, ^uintptr(0), 0, 0, 0, 0) }},
	{"userfaultfd", func() error { return closeFd(raw1(unix.SYS_USERFAULTFD, unix.O_CLOEXEC)) }},
	{"process_vm_readv", func() error { return raw(unix.SYS_PROCESS_VM_READV, uintptr(os.Getpid()), 0, 0, 0, 0, 0) }},
	{"personality_no_aslr", func() error { return raw(unix.SYS_PERSONALITY, 0x0040000) }}, // ADDR_NO_RANDOMIZE
	// io_uring does I/O the filter never sees (current Docker refuses it).
	{"io_uring_setup", func() error {
		var params [120]byte // struct io_uring_params
		return closeFd(raw1(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0]))))
	}},
	{"io_uring_enter", func() error { return raw(unix.SYS_IO_URING_ENTER, ^uintptr(0), 0, 0, 0, 0, 0) }}, // EBADF if allowed
	{"io_uring_register", func() error { return raw(unix.SYS_IO_URING_REGISTER, ^uintptr(0), 0, 0, 0) }},
	// Allowed: the result is the kernel's own.
	{"ptrace", func() error { return raw(unix.SYS_PTRACE, unix.PTRACE_PEEKDATA, 1<<30, 0, 0) }}, // no such pid: ESRCH
	{"chroot", func() error { return unix.Chroot("/nonexistent-eos-probe") }},
	{"clone", func() error { return forkNoop(0) }},
	{"personality_query", func() error { return raw(unix.SYS_PERSONALITY, 0xffffffff) }},
}

// wantDenied and wantAllowed are what a session must get: EPERM from its filter (ENOSYS
// for clone3, so libcs fall back to clone), and "not EPERM" for what
// Docker's default profile allows.
var (
	wantDenied = map[string]string{
		"unshare_newuser": "EPERM", "unshare_none": "EPERM", "clone_newuser": "EPERM", "clone_newns": "EPERM",
		"clone3": "ENOSYS", "setns": "EPERM", "mount": "EPERM", "umount2": "EPERM", "pivot_root": "EPERM",
		"fsopen": "EPERM", "keyctl": "EPERM", "add_key": "EPERM", "request_key": "EPERM", "bpf": "EPERM",
		"perf_event_open": "EPERM", "init_module": "EPERM", "finit_module": "EPERM", "delete_module": "EPERM",
		"kexec_load": "EPERM", "open_by_handle_at": "EPERM", "name_to_handle_at": "EPERM", "userfaultfd": "EPERM",
		"process_vm_readv": "EPERM", "personality_no_aslr": "EPERM",
		"io_uring_setup": "EPERM", "io_uring_enter": "EPERM", "io_uring_register": "EPERM",
	}
	wantAllowed = []string{"ptrace", "chroot", "clone", "personality_query"}
)

// probeSyscalls runs every probe and prints {"name": "ok" | "EPERM" | ...}.
func probeSyscalls() int {
	out := map[string]string{}
	for _, p := range syscallProbes {
		out[p.name] = errnoName(p.call())
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 1
	}
	return 0
}

func errnoName(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
	}
	return err.Error()
}

// checkSyscalls compares a probeSyscalls output with wantDenied and
// wantAllowed and returns the differences.
func checkSyscalls(out string) (map[string]string, error) {
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		return nil, fmt.Errorf("decode %q: %w", out, err)
	}
	var errs []error
	for name, want := range wantDenied {
		if got[name] != want {
			errs = append(errs, fmt.Errorf("%s: got %q, want %s", name, got[name], want))
		}
	}
	for _, name := range wantAllowed {
		if g, ok := got[name]; !ok || g == "EPERM" || g == "ENOSYS" {
			errs = append(errs, fmt.Errorf("%s: got %q, want it allowed", name, g))
		}
	}
	return got, errors.Join(errs...)
}

func raw(trap uintptr, args ...uintptr) error {
	_, err := raw1(trap, args...)
	return err
}

func raw1(trap uintptr, args ...uintptr) (uintptr, error) {
	var a [6]uintptr
	copy(a[:], args)
	r, _, e := unix.Syscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
	if e != 0 {
		return r, e
	}
	return r, nil
}

func closeFd(fd uintptr, err error) error {
	if err == nil {
		_ = unix.Close(int(fd))
	}
	return err
}

// forkNoop starts this binary as "noop" with the given clone flags (Go
// uses clone, not clone3, for these) and waits for it.
func forkNoop(cloneflags uintptr) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	attr := &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Cloneflags: cloneflags}}
	if cloneflags&unix.CLONE_NEWUSER != 0 {
		// Map root, so that the child could exec if the clone were allowed.
		attr.Sys.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		attr.Sys.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	pid, err := syscall.ForkExec(exe, []string{exe, "noop"}, attr)
	if err != nil {
		return err
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return err
	}
	if ws.ExitStatus() != 0 {
		return fmt.Errorf("noop exited %v", ws)
	}
	return nil
}
