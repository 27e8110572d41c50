//go:build cgo && seccomp

package runtime

// The sessions' seccomp filter compiled once per daemon. runc init would
// compile it with libseccomp for every session start and every
// libcontainer exec (10-20 ms each); instead New compiles it here, the way
// runc's seccomp.InitSeccomp does (same libseccomp calls, same -ENOSYS
// stub from runc's patchbpf), and the session's init and every
// libcontainer exec load the finished program themselves (seccompload_linux.go).

import (
	"errors"
	"fmt"
	_ "unsafe" // go:linkname

	"github.com/opencontainers/runc/libcontainer/configs"
	_ "github.com/opencontainers/runc/libcontainer/seccomp/patchbpf" // linked for enosysPatchFilter below
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// enosysPatchFilter is runc's (v1.5.3, pinned in go.mod) program for a
// libseccomp filter with the stub that answers syscalls newer than every
// one the profile names with ENOSYS, so libcs fall back instead of seeing
// EPERM. It is what runc's PatchAndLoad would load; runc exports only the
// loading variant, so it is linked by name. TestCompiledFilter checks the
// program behaves as runc's does (denials, ENOSYS for new syscalls).
//
//go:linkname enosysPatchFilter github.com/opencontainers/runc/libcontainer/seccomp/patchbpf.enosysPatchFilter
func enosysPatchFilter(config *configs.Seccomp, filter *libseccomp.ScmpFilter) ([]unix.SockFilter, error)

// compileFilter builds c into a BPF program and its seccomp(2) flags,
// exactly as runc init would before loading it.
func compileFilter(c *configs.Seccomp) (*compiledFilter, error) {
	if c == nil {
		return nil, errors.New("compile seccomp filter: no filter")
	}
	def, err := scmpAction(c.DefaultAction, c.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("compile seccomp filter: default action: %w", err)
	}
	f, err := libseccomp.NewFilter(def)
	if err != nil {
		return nil, fmt.Errorf("compile seccomp filter: %w", err)
	}
	defer f.Release()
	for _, a := range c.Architectures {
		arch, err := libseccomp.GetArchFromString(a)
		if err != nil {
			return nil, fmt.Errorf("compile seccomp filter: %w", err)
		}
		if err := f.AddArch(arch); err != nil {
			return nil, fmt.Errorf("compile seccomp filter: add arch %s: %w", a, err)
		}
	}
	var flags uint
	for _, fl := range c.Flags {
		if fl != flagSpecAllow { // the only flag newSessionFilter sets
			return nil, fmt.Errorf("compile seccomp filter: flag %s is not supported", fl)
		}
		if err := f.SetSSB(true); err != nil {
			return nil, fmt.Errorf("compile seccomp filter: %s: %w", fl, err)
		}
		flags |= unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
	}
	if len(c.Syscalls) > 32 { // as runc: libseccomp's binary tree for long rule sets
		_ = f.SetOptimize(2)
	}
	if err := f.SetNoNewPrivsBit(false); err != nil { // runc sets no_new_privs itself
		return nil, fmt.Errorf("compile seccomp filter: %w", err)
	}
	for _, call := range c.Syscalls {
		if err := addRule(f, call, def); err != nil {
			return nil, fmt.Errorf("compile seccomp filter: %w", err)
		}
	}
	prog, err := enosysPatchFilter(c, f)
	if err != nil {
		return nil, fmt.Errorf("compile seccomp filter: %w", err)
	}
	return &compiledFilter{Prog: prog, Flags: flags}, nil
}

// scmpAction is runc's getAction for the actions session filters use.
func scmpAction(act configs.Action, errnoRet *uint) (libseccomp.ScmpAction, error) {
	switch act {
	case configs.Allow:
		return libseccomp.ActAllow, nil
	case configs.Errno:
		if errnoRet != nil {
			return libseccomp.ActErrno.SetReturnCode(int16(*errnoRet)), nil
		}
		return libseccomp.ActErrno.SetReturnCode(int16(unix.EPERM)), nil
	case configs.Kill, configs.KillThread:
		return libseccomp.ActKillThread, nil
	case configs.KillProcess:
		return libseccomp.ActKillProcess, nil
	case configs.Trap:
		return libseccomp.ActTrap, nil
	case configs.Log:
		return libseccomp.ActLog, nil
	default:
		return libseccomp.ActInvalid, fmt.Errorf("action %d is not supported for sessions", act)
	}
}

func scmpOperator(op configs.Operator) (libseccomp.ScmpCompareOp, error) {
	switch op {
	case configs.EqualTo:
		return libseccomp.CompareEqual, nil
	case configs.NotEqualTo:
		return libseccomp.CompareNotEqual, nil
	case configs.GreaterThan:
		return libseccomp.CompareGreater, nil
	case configs.GreaterThanOrEqualTo:
		return libseccomp.CompareGreaterEqual, nil
	case configs.LessThan:
		return libseccomp.CompareLess, nil
	case configs.LessThanOrEqualTo:
		return libseccomp.CompareLessOrEqual, nil
	case configs.MaskEqualTo:
		return libseccomp.CompareMaskedEqual, nil
	default:
		return libseccomp.CompareInvalid, fmt.Errorf("operator %d is not supported", op)
	}
}

// addRule is runc's matchCall: a rule equal to the default is skipped, a
// syscall libseccomp does not know is skipped, conditions on the same
// argument become separate rules.
func addRule(f *libseccomp.ScmpFilter, call *configs.Syscall, def libseccomp.ScmpAction) error {
	if call == nil || call.Name == "" {
		return errors.New("empty syscall rule")
	}
	act, err := scmpAction(call.Action, call.ErrnoRet)
	if err != nil {
		return fmt.Errorf("%s: %w", call.Name, err)
	}
	if act == def {
		return nil
	}
	num, err := libseccomp.GetSyscallFromName(call.Name)
	if err != nil {
		return nil // unknown to this libseccomp: runc ignores it too
	}
	if len(call.Args) == 0 {
		if err := f.AddRule(num, act); err != nil {
			return fmt.Errorf("rule for %s: %w", call.Name, err)
		}
		return nil
	}
	var perArg [6]int
	conds := make([]libseccomp.ScmpCondition, 0, len(call.Args))
	for _, a := range call.Args {
		op, err := scmpOperator(a.Op)
		if err != nil {
			return fmt.Errorf("%s: %w", call.Name, err)
		}
		cond, err := libseccomp.MakeCondition(a.Index, op, a.Value, a.ValueTwo)
		if err != nil {
			return fmt.Errorf("%s: %w", call.Name, err)
		}
		if a.Index < uint(len(perArg)) {
			perArg[a.Index]++
		}
		conds = append(conds, cond)
	}
	shared := false
	for _, n := range perArg {
		shared = shared || n > 1
	}
	if shared {
		for _, c := range conds {
			if err := f.AddRuleConditional(num, act, []libseccomp.ScmpCondition{c}); err != nil {
				return fmt.Errorf("rule for %s: %w", call.Name, err)
			}
		}
		return nil
	}
	if err := f.AddRuleConditional(num, act, conds); err != nil {
		return fmt.Errorf("rule for %s: %w", call.Name, err)
	}
	return nil
}
