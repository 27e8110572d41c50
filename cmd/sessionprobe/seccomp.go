package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
)

// checkSeccomp: every session process, on both exec paths, runs under the
// session's own seccomp filter (stacked on the sandbox's), which denies what
// Docker's default profile denies a container without SYS_ADMIN, while
// ordinary work goes on.
func (p *probe) checkSeccomp(ctx context.Context, a *runtime.Session) {
	b, _ := os.ReadFile("/proc/self/status")
	sandboxFilters, _ := strconv.Atoi(statusFields(string(b))["Seccomp_filters"])
	exe, _ := os.Executable()
	// What the sandbox itself (the daemon's profile) allows, for comparison.
	if out, err := exec.CommandContext(ctx, exe, "syscalls").Output(); err == nil {
		p.emit("info_sandbox_syscalls", true, "filters", sandboxFilters, "got", strings.TrimSpace(string(out)))
	}
	for _, via := range []bool{false, true} {
		suffix := ""
		if via {
			suffix = "_via_init"
		}
		r, err := run(ctx, a, via, "grep", "-E", "^Seccomp(_filters)?:", "/proc/self/status")
		f := statusFields(r.out)
		n, _ := strconv.Atoi(f["Seccomp_filters"])
		p.errCheck("seccomp_filter"+suffix, errors.Join(err,
			want(f["Seccomp"] == "2", "Seccomp %q (2 is filter mode)", f["Seccomp"]),
			want(n > sandboxFilters, "%d filters, the sandbox has %d: no session filter", n, sandboxFilters)),
			"filters", n, "sandbox_filters", sandboxFilters)

		r, err = run(ctx, a, via, exe, "syscalls")
		got, cerr := checkSyscalls(r.out)
		p.errCheck("seccomp_syscalls"+suffix, errors.Join(err, cerr, want(r.code == 0, "exit %d: %s", r.code, r.errOut)),
			"got", got)

		for _, c := range []struct{ name, script string }{
			{"userns_denied", "unshare -U -r true"},
			{"unshare_denied", "unshare -m true"},
			{"mount_denied", "mkdir -p /mnt && mount -t tmpfs x /mnt"},
		} {
			r, err := run(ctx, a, via, "sh", "-c", c.script+" 2>&1; echo rc=$?")
			p.errCheck(c.name+suffix, errors.Join(err, want(failed(r.out), "%q worked: %q", c.script, r.out)),
				"out", strings.TrimSpace(r.out+r.errOut))
		}
		p.checkNormalWork(ctx, a, via, suffix)
	}
}

// failed reports whether a script's output ends with a non-zero "rc=N".
func failed(out string) bool {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	return strings.HasPrefix(last, "rc=") && last != "rc=0"
}

// checkNormalWork runs what a workspace does all day. git, python3 and apt
// are checked where the image has them (eos-test-debian); the test asks for
// those checks by image.
func (p *probe) checkNormalWork(ctx context.Context, a *runtime.Session, via bool, suffix string) {
	r1, err1 := run(ctx, a, via, "sh", "-c", "echo x > /tmp/f && cat /tmp/f")
	r2, err2 := run(ctx, a, via, "ls", "-la", "/")
	p.errCheck("normal_work"+suffix, errors.Join(err1, err2,
		want(r1.code == 0 && r1.out == "x\n", "echo/cat: exit %d %q %q", r1.code, r1.out, r1.errOut),
		want(r2.code == 0 && strings.Contains(r2.out, "workspace"), "ls -la /: exit %d %q", r2.code, head(r2.out+r2.errOut))))

	tools := []struct{ name, bin, script, want string }{
		{"git_works", "git", `set -e; d=/tmp/r$$; git init -q $d; git -C $d status >/dev/null
echo hi > $d/f; git -C $d add f; git -C $d -c user.name=p -c user.email=p@example.com commit -qm init
git clone -q $d $d-clone; git -C $d-clone log --oneline | wc -l`, "1\n"},
		// Threads (glibc tries clone3 first: ENOSYS must make it fall back
		// to clone), subprocesses and a multiprocessing pool (fork, /dev/shm
		// semaphores).
		{"python_works", "python3", `python3 -c "print(1)" && python3 -c '
import threading, subprocess, multiprocessing as mp
t = threading.Thread(target=lambda: None); t.start(); t.join()
assert subprocess.run(["true"]).returncode == 0
with mp.Pool(2) as pool: print(sum(pool.map(abs, [-1, -2])))'`, "1\n3\n"},
		{"apt_works", "apt-get", `apt-get -qq check && dpkg-query -W -f '${Status}\n' git`, "install ok installed\n"},
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t.bin); err != nil {
			continue // not in this image (the session's root is the sandbox's)
		}
		r, err := run(ctx, a, via, "sh", "-c", t.script)
		p.errCheck(t.name+suffix, errors.Join(err, want(r.code == 0 && r.out == t.want, "exit %d %q %q", r.code, r.out, head(r.errOut))),
			"out", strings.TrimSpace(r.out))
	}
}
