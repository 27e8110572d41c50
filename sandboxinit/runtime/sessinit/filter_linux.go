package sessinit

// Loading the sessions' precompiled seccomp filter (seccompbpf_linux.go
// (package runtime) compiles it once per daemon). The daemon hands the program to a session
// process as a sealed memfd and starts that process from the daemon's own
// binary by descriptor (/proc/self/fd/N), never by a path inside the
// session, whose root a session can write: a session cannot swap the
// binary that is supposed to filter it.
//
//   - The session init: runc init execs the daemon binary as "sessinit"
//     with EOS_SECCOMP_FD; Main loads the filter (TSYNC: every
//     thread of the Go process) before it serves anything, then reports
//     on EOS_READY_FD. Start waits for that report and checks in
//     /proc/<pid>/status that the init runs under one filter more than the
//     daemon, so a session never runs unfiltered. Fast-path processes are
//     forked by the init and inherit the filter.
//   - A libcontainer exec (TTY): runc init execs the daemon binary as
//     "sessexec", which loads the filter and execs the command
//     (ExecMain, dispatched by runtime.InitMain).

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Environment variables naming descriptors a session process was handed.
const (
	SeccompFDEnv = "EOS_SECCOMP_FD" // the sealed memfd with the program
	ExeFDEnv     = "EOS_EXE_FD"     // the binary it was started from (closed at once)
	ReadyFDEnv   = "EOS_READY_FD"   // the session init reports "filter loaded" here
)

// Filter is a seccomp program ready for seccomp(2).
type Filter struct {
	Prog  []unix.SockFilter
	Flags uint // SECCOMP_FILTER_FLAG_*
}

const filterMagic = "EOSBPF1\n"

// Encode is the memfd's content: magic, flags, instruction count, the
// instructions (8 bytes each, native order: the reader is this binary).
func (f *Filter) Encode() []byte {
	b := make([]byte, 0, len(filterMagic)+8+8*len(f.Prog))
	b = append(b, filterMagic...)
	b = binary.NativeEndian.AppendUint32(b, uint32(f.Flags))
	b = binary.NativeEndian.AppendUint32(b, uint32(len(f.Prog)))
	for _, in := range f.Prog {
		b = binary.NativeEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.NativeEndian.AppendUint32(b, in.K)
	}
	return b
}

// DecodeFilter reads what Encode wrote.
func DecodeFilter(b []byte) (*Filter, error) {
	if len(b) < len(filterMagic)+8 || string(b[:len(filterMagic)]) != filterMagic {
		return nil, errors.New("not a compiled seccomp filter")
	}
	b = b[len(filterMagic):]
	f := &Filter{Flags: uint(binary.NativeEndian.Uint32(b))}
	n := int(binary.NativeEndian.Uint32(b[4:]))
	b = b[8:]
	if n == 0 || n > unix.BPF_MAXINSNS || len(b) != 8*n {
		return nil, fmt.Errorf("compiled seccomp filter: %d instructions in %d bytes", n, len(b))
	}
	f.Prog = make([]unix.SockFilter, n)
	for i := range f.Prog {
		in := b[8*i:]
		f.Prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.NativeEndian.Uint32(in[4:])}
	}
	return f, nil
}

// memfd returns a sealed, read-only memfd holding the program, to hand to
// session processes.
func (f *Filter) Memfd() (*os.File, error) {
	fd, err := unix.MemfdCreate("eos-session-seccomp", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd for the seccomp filter: %w", err)
	}
	mf := os.NewFile(uintptr(fd), "eos-session-seccomp")
	if _, err := mf.Write(f.Encode()); err != nil {
		mf.Close()
		return nil, fmt.Errorf("write seccomp filter: %w", err)
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		mf.Close()
		return nil, fmt.Errorf("seal seccomp filter: %w", err)
	}
	return mf, nil
}

// load installs the program on every thread of this process (TSYNC).
// no_new_privs must be set already (runc init sets it).
func (f *Filter) Load() error {
	fprog := unix.SockFprog{Len: uint16(len(f.Prog)), Filter: &f.Prog[0]}
	r, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		uintptr(f.Flags|unix.SECCOMP_FILTER_FLAG_TSYNC), uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(f.Prog)
	if errno != 0 {
		return fmt.Errorf("load seccomp filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("load seccomp filter: thread %d could not be synchronised", r)
	}
	return nil
}

// LoadHandedFilter loads the filter named by EOS_SECCOMP_FD and closes the
// descriptors the daemon handed over (filter, binary). present is false
// when this process was given no filter.
func LoadHandedFilter() (present bool, err error) {
	if v := os.Getenv(ExeFDEnv); v != "" {
		_ = os.Unsetenv(ExeFDEnv)
		if fd, err := strconv.Atoi(v); err == nil && fd > 2 {
			_ = unix.Close(fd)
		}
	}
	v := os.Getenv(SeccompFDEnv)
	if v == "" {
		return false, nil
	}
	_ = os.Unsetenv(SeccompFDEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return true, fmt.Errorf("bad %s=%q", SeccompFDEnv, v)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return true, fmt.Errorf("seccomp filter fd: %w", err)
	}
	if st.Size <= 0 || st.Size > 1<<20 {
		return true, fmt.Errorf("seccomp filter fd: %d bytes", st.Size)
	}
	b := make([]byte, st.Size)
	if _, err := unix.Pread(fd, b, 0); err != nil {
		return true, fmt.Errorf("read seccomp filter: %w", err)
	}
	f, err := DecodeFilter(b)
	if err != nil {
		return true, err
	}
	return true, f.Load()
}

// reportReady writes the init's result to EOS_READY_FD and closes it.
func reportReady(loadErr error) {
	v := os.Getenv(ReadyFDEnv)
	if v == "" {
		return
	}
	_ = os.Unsetenv(ReadyFDEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return
	}
	msg := "ok\n"
	if loadErr != nil {
		msg = "error: " + strings.ReplaceAll(loadErr.Error(), "\n", " ") + "\n"
	}
	_, _ = unix.Write(fd, []byte(msg))
	_ = unix.Close(fd)
}

// ExecMain is a libcontainer exec in a session: load the handed
// filter, then exec args (resolved with the environment's PATH). It never
// returns on success; 126 or 127 like a shell when it cannot.
func ExecMain(args []string) int {
	present, err := LoadHandedFilter()
	if err == nil && !present {
		err = errors.New("no seccomp filter was handed over")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessexec:", err)
		return 126
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "sessexec: no command")
		return 126
	}
	cwd, _ := os.Getwd()
	path, err := lookPath(args[0], os.Environ(), cwd)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessexec:", err)
		return 127
	}
	err = unix.Exec(path, args, os.Environ())
	fmt.Fprintf(os.Stderr, "sessexec: exec %s: %v\n", args[0], err)
	if errors.Is(err, unix.ENOENT) {
		return 127
	}
	return 126
}

// SeccompFilters reads the "Seccomp_filters" count of pid's status (-1 when
// the kernel does not report it).
func SeccompFilters(pid string) (int, error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Seccomp_filters:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return -1, sc.Err()
}
