package activities

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// testELF is a minimal 64-bit little-endian ELF file of type typ for
// machine m: one PT_LOAD, and a PT_INTERP naming interp when interp is set
// (what a dynamically linked executable has).
func testELF(typ elf.Type, m elf.Machine, interp string) []byte {
	const ehsize, phentsize = 64, 56
	phnum := 1
	if interp != "" {
		phnum = 2
	}
	data := ehsize + phentsize*phnum
	b := make([]byte, data+len(interp)+1)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le := binary.LittleEndian
	le.PutUint16(b[16:], uint16(typ))
	le.PutUint16(b[18:], uint16(m))
	le.PutUint32(b[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(b[24:], 0x401000) // entry
	le.PutUint64(b[32:], ehsize)   // program headers right after this header
	le.PutUint16(b[52:], ehsize)
	le.PutUint16(b[54:], phentsize)
	le.PutUint16(b[56:], uint16(phnum))
	le.PutUint16(b[58:], 64) // section header entry size (no sections)
	ph := func(i int, typ elf.ProgType, off, size uint64) {
		p := b[ehsize+i*phentsize:]
		le.PutUint32(p[0:], uint32(typ))
		le.PutUint32(p[4:], uint32(elf.PF_R))
		le.PutUint64(p[8:], off)
		le.PutUint64(p[16:], 0x400000+off)
		le.PutUint64(p[24:], 0x400000+off)
		le.PutUint64(p[32:], size)
		le.PutUint64(p[40:], size)
		le.PutUint64(p[48:], 0x1000)
	}
	ph(0, elf.PT_LOAD, 0, uint64(len(b)))
	if interp != "" {
		copy(b[data:], interp)
		ph(1, elf.PT_INTERP, uint64(data), uint64(len(interp)+1))
	}
	return b
}

// hugeInterp is a dynamic executable whose PT_INTERP header claims 1 TiB.
func hugeInterp() []byte {
	b := testELF(elf.ET_EXEC, elfMachines[runtime.GOARCH], "/lib/ld.so")
	binary.LittleEndian.PutUint64(b[64+56+32:], 1<<40) // the second program header's p_filesz
	return b
}

// staticTestELF is a file checkStaticExecutable accepts on this machine.
func staticTestELF() []byte { return testELF(elf.ET_EXEC, elfMachines[runtime.GOARCH], "") }

// fakeBuild is a daemon or session-init build for tests that never run it:
// a static executable of this machine followed by tag (which tells builds
// apart).
func fakeBuild(tag string) []byte { return append(staticTestELF(), tag...) }

func otherMachine() elf.Machine {
	if runtime.GOARCH == "arm64" {
		return elf.EM_X86_64
	}
	return elf.EM_AARCH64
}

func TestCheckStaticExecutable(t *testing.T) {
	require.NoError(t, checkStaticExecutable("d", staticTestELF()))
	require.NoError(t, checkStaticExecutable("d", testELF(elf.ET_DYN, elfMachines[runtime.GOARCH], "")), "a static PIE has no interpreter either")
	for _, tc := range []struct {
		name, want string
		data       []byte
	}{
		{"dynamic", "linked dynamically (it needs /lib64/ld-linux-x86-64.so.2)", testELF(elf.ET_EXEC, elfMachines[runtime.GOARCH], "/lib64/ld-linux-x86-64.so.2")},
		{"another architecture", "is built for " + otherMachine().String(), testELF(elf.ET_EXEC, otherMachine(), "")},
		{"an object file", "not an executable", testELF(elf.ET_REL, elfMachines[runtime.GOARCH], "")},
		{"a script", "is not an ELF executable", []byte("#!/bin/sh\nexec true\n")},
		{"empty", "is not an ELF executable", nil},
		{"truncated", "is not an ELF executable", staticTestELF()[:40]},
		{"an interpreter header claiming 1 TiB", "linked dynamically (it needs /lib/ld.so)", hugeInterp()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkStaticExecutable("/x/sandbox-daemon", tc.data)
			require.Error(t, err)
			require.Contains(t, err.Error(), "/x/sandbox-daemon")
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "make binaries")
		})
	}
}

// A create refuses a daemon build that could not run in its container
// (and the session init beside it), before Docker is asked for anything,
// and says why; a worker process refuses it at start (CheckDaemonFiles).
func TestCreateRefusesADaemonThatCannotRun(t *testing.T) {
	for _, file := range []string{"sandbox-daemon", "sandbox-sessinit"} {
		t.Run(file, func(t *testing.T) {
			d := newFakeDocker()
			acts := newTestActivities(t, d)
			dynamic := testELF(elf.ET_EXEC, elfMachines[runtime.GOARCH], "/lib/ld-musl-x86_64.so.1")
			require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(acts.cfg.DaemonBinary), file), dynamic, 0o755))

			err := acts.CheckDaemonFiles()
			require.ErrorContains(t, err, "linked dynamically (it needs /lib/ld-musl-x86_64.so.1)")
			_, err = acts.CreateContainer(t.Context(), testSpec("sbx1"))
			requireAppError(t, err, api.KindOperationFailed, true) // the deployment's fault, not the caller's
			require.ErrorContains(t, err, file)
			require.Empty(t, d.containers, "nothing was created")
		})
	}
}
