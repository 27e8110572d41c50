package activities

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"runtime"

	"go.temporal.io/sdk/temporal"
)

// elfMachines is the ELF machine of each architecture a sandbox's daemon
// can be built for: the daemon runs in containers of this host, so its
// binary must be this host's.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386, "arm": elf.EM_ARM,
	"ppc64le": elf.EM_PPC64, "riscv64": elf.EM_RISCV, "s390x": elf.EM_S390, "loong64": elf.EM_LOONGARCH,
}

// checkStaticExecutable refuses a daemon or session-init binary that
// cannot run in a sandbox container: one that is not an ELF executable of
// this machine's architecture, or one linked dynamically. A sandbox's image
// need not carry a C library or a loader, and Docker reports a missing
// loader only as "exec <path>: no such file or directory", from a container
// that then restarts until the create gives up. name is what the error
// calls the file.
func checkStaticExecutable(name string, data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s is not an ELF executable (%v): build it with `make binaries`", name, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%s is an ELF %s, not an executable: build it with `make binaries`", name, f.Type)
	}
	if want, ok := elfMachines[runtime.GOARCH]; ok && f.Machine != want {
		return fmt.Errorf("%s is built for %s, but this machine's containers run %s (%s): build it here with `make binaries`", name, f.Machine, want, runtime.GOARCH)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		interp := make([]byte, min(p.Filesz, 4096)) // a path; the header's size is not trusted
		n, _ := p.ReadAt(interp, 0)
		interp, _, _ = bytes.Cut(interp[:n], []byte{0})
		if len(interp) == 0 {
			interp = []byte("a program interpreter")
		}
		return fmt.Errorf("%s is linked dynamically (it needs %s), which a sandbox's image need not have: build it statically with `make binaries`",
			name, interp)
	}
	return nil
}

// CheckDaemonFiles reads the configured daemon binary and the session init
// beside it, and refuses them unless both can run in a sandbox container
// (checkStaticExecutable). Worker processes call it at start, so a wrong
// --daemon-binary stops them with the reason instead of failing every
// create; each create checks again when the files changed since.
func (a *Activities) CheckDaemonFiles() error {
	_, err := a.readDaemonFiles()
	var ae *temporal.ApplicationError
	if errors.As(err, &ae) {
		return errors.New(ae.Message()) // for a person reading a start-up error, not for Temporal
	}
	return err
}
