package runtime

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// seccompSetup is what the sandbox's seccomp profile allows.
type seccompSetup struct {
	// noNewKeyring: keyctl is blocked (Docker's default profile), so sessions
	// must not try to create their own session keyring.
	noNewKeyring bool
}

// checkSeccomp probes the syscalls Docker's default profile blocks and
// sessions need. pivot_root is required: its alternative (MS_MOVE plus
// chroot) is escapable by a session holding SYS_CHROOT. keyctl is optional.
// Call it only after checkCaps: without SYS_ADMIN pivot_root fails anyway.
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
	return s, nil
}
