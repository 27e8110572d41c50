// Command sessionprobe exercises sandboxinit/runtime inside a sandbox
// container, the way the daemon will: it is the container's PID 1, starts
// sessions, checks their isolation and limits, restarts itself in place
// (execve, still PID 1) to re-attach with Load, destroys everything and
// prints one JSON object per check on stdout.
//
//	sessionprobe [-state /eos] [-n 100]   run every check
//	sessionprobe sessinit [args...]       the session init (PID 1 of a session)
//	sessionprobe serve PORT TEXT          answer TEXT to every TCP connection
//	sessionprobe dial ADDR                print what ADDR answers
//	sessionprobe syscalls                 try the syscalls a session's seccomp filter denies, print the errnos
//	sessionprobe noop                     exit 0 (the child of the clone probes)
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime"
)

func main() {
	runtime.InitMain()
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "sessinit":
			os.Exit(runtime.SessionInitMain(os.Args[2:]))
		case "serve":
			os.Exit(serve(os.Args[2], os.Args[3]))
		case "dial":
			os.Exit(dial(os.Args[2]))
		case "syscalls":
			os.Exit(probeSyscalls())
		case "noop":
			os.Exit(0)
		}
	}
	state := flag.String("state", "/eos", "state volume")
	n := flag.Int("n", 100, "exec latency samples per path")
	phase := flag.String("phase", "start", "start | reload (internal: after re-exec)")
	flag.Parse()
	p := &probe{state: *state, n: *n, out: json.NewEncoder(os.Stdout)}
	ok := false
	switch *phase {
	case "start":
		ok = p.phaseStart()
	case "reload":
		ok = p.phaseReload()
	}
	if ok {
		os.Exit(0)
	}
	os.Exit(1)
}

type probe struct {
	state string
	n     int
	out   *json.Encoder
	rt    *runtime.Runtime
	fails []string
}

// emit prints one check; ok=false records a failure.
func (p *probe) emit(check string, ok bool, kv ...any) {
	m := map[string]any{"check": check, "ok": ok}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	_ = p.out.Encode(m)
	if !ok {
		p.fails = append(p.fails, check)
	}
}

func (p *probe) errCheck(check string, err error, kv ...any) bool {
	if err != nil {
		p.emit(check, false, append(kv, "error", err.Error())...)
		return false
	}
	p.emit(check, true, kv...)
	return true
}

func (p *probe) done() bool {
	p.emit("done", len(p.fails) == 0, "failed", p.fails)
	return len(p.fails) == 0
}

func (p *probe) specFor(id string, isolated bool, lim runtime.Limits) runtime.SessionSpec {
	exe, _ := os.Executable()
	ws := filepath.Join(p.state, "ws", id)
	_ = os.MkdirAll(ws, 0o755)
	return runtime.SessionSpec{
		ID: id, Dir: filepath.Join(p.state, "sessions", id), Workspace: ws,
		Isolated: isolated, Limits: lim, Hidden: []string{p.state},
		InitPath: exe, InitArgs: []string{"sessinit"},
	}
}

type result struct {
	out, errOut string
	code        int
}

func run(ctx context.Context, s *runtime.Session, viaInit bool, args ...string) (result, error) {
	var o, e bytes.Buffer
	pr, err := s.Exec(ctx, runtime.ProcSpec{Args: args, Stdout: &o, Stderr: &e, ViaInit: viaInit})
	if err != nil {
		return result{}, err
	}
	code, err := pr.Wait()
	return result{out: o.String(), errOut: e.String(), code: code}, err
}

func sh(ctx context.Context, s *runtime.Session, script string) (result, error) {
	return run(ctx, s, false, "sh", "-c", script)
}

func (p *probe) phaseStart() bool {
	ctx := context.Background()
	_ = os.RemoveAll(filepath.Join(p.state, "sessions"))
	_ = os.RemoveAll(filepath.Join(p.state, "ws"))
	t0 := time.Now()
	rt, err := runtime.New(filepath.Join(p.state, "runtime"))
	if !p.errCheck("new", err, "ms", ms(time.Since(t0))) {
		return p.done()
	}
	p.rt = rt

	specs := []runtime.SessionSpec{
		p.specFor("a", false, runtime.Limits{}),
		p.specFor("b", true, runtime.Limits{}),
		p.specFor("c", true, runtime.Limits{PidsMax: 64, MemoryBytes: 128 << 20, CPUs: 0.5}),
	}
	// a's workspace is a shared mount, as the daemon's anchor of a
	// session's is (here a bind onto itself, so the checks can write into
	// it): what is mounted on it later reaches a.
	ws := specs[0].Workspace
	err = unix.Mount(ws, ws, "", unix.MS_BIND, "")
	if err == nil {
		err = unix.Mount("", ws, "", unix.MS_SHARED, "")
	}
	if !p.errCheck("workspace_anchor", err) {
		return p.done()
	}
	sess := map[string]*runtime.Session{}
	for i, spec := range specs {
		t := time.Now()
		s, err := rt.Start(ctx, spec)
		if !p.errCheck("start_"+spec.ID, err, "ms", ms(time.Since(t)), "isolated", spec.Isolated) {
			return p.done()
		}
		sess[spec.ID] = s
		specs[i].Addr = s.IP() // the caller's metadata, kept for Load
	}
	a, b, c := sess["a"], sess["b"], sess["c"]

	p.checkLatency(ctx, a)
	p.checkParallelExec(ctx, a)
	p.checkRootIsolation(ctx, a, b)
	p.checkWorkspace(ctx, a, specs[0])
	p.checkWorkspaceFollows(ctx, a, specs[0])
	p.checkFreeze(ctx, a, specs[0])
	p.checkPrivileges(ctx, a)
	p.checkHidden(ctx, a)
	p.checkLimits(ctx, c)
	p.checkNetwork(ctx, a, b, c)
	p.checkTTY(ctx, a)
	p.checkSignals(ctx, a)

	// Restart in place: still PID 1, the session inits live on.
	b1, err := json.Marshal(specs)
	if err == nil {
		err = os.WriteFile(filepath.Join(p.state, "probe-specs.json"), b1, 0o600)
	}
	if !p.errCheck("save_specs", err) {
		return p.done()
	}
	initC, _ := c.InitPid()
	_ = os.WriteFile(filepath.Join(p.state, "probe-kill.txt"), []byte(strconv.Itoa(initC)), 0o600)
	if len(p.fails) > 0 {
		return p.done()
	}
	exe, _ := os.Executable()
	err = syscall.Exec(exe, []string{os.Args[0], "-phase=reload", "-state=" + p.state}, os.Environ())
	p.emit("reexec", false, "error", err.Error())
	return p.done()
}

func (p *probe) phaseReload() bool {
	ctx := context.Background()
	p.emit("reexec", os.Getpid() == 1, "pid", os.Getpid())
	rt, err := runtime.New(filepath.Join(p.state, "runtime"))
	if !p.errCheck("new_after_restart", err) {
		return p.done()
	}
	var specs []runtime.SessionSpec
	b, err := os.ReadFile(filepath.Join(p.state, "probe-specs.json"))
	if err == nil {
		err = json.Unmarshal(b, &specs)
	}
	if !p.errCheck("read_specs", err) {
		return p.done()
	}
	ids, err := rt.Sessions()
	slices.Sort(ids)
	p.errCheck("sessions_listed", errors.Join(err, want(slices.Equal(ids, []string{"a", "b", "c"}), "sessions %v", ids)), "ids", ids)

	// c's init dies while the daemon is "down": Load must report it gone
	// and clean up.
	kb, _ := os.ReadFile(filepath.Join(p.state, "probe-kill.txt"))
	if pid, _ := strconv.Atoi(string(kb)); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 200; i++ {
			var ws syscall.WaitStatus
			if wp, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); wp == pid {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	loaded := map[string]*runtime.Session{}
	for _, spec := range specs {
		s, err := rt.Load(spec.ID, spec)
		if spec.ID == "c" {
			p.emit("load_gone_c", errors.Is(err, runtime.ErrGone), "error", fmt.Sprint(err),
				"cgroup_left", cgroupLeft("c"), "root_mounted", mounted(filepath.Join(spec.Dir, "root", "merged")))
			continue
		}
		if !p.errCheck("load_"+spec.ID, err) {
			continue
		}
		loaded[spec.ID] = s
		r, err := run(ctx, s, false, "cat", "/etc/eos-probe")
		p.errCheck("exec_after_load_"+spec.ID, errors.Join(err, want(r.code == 0 || spec.ID == "b", "exit %d", r.code)),
			"out", strings.TrimSpace(r.out), "ip", s.IP(), "ip_kept", s.IP() == spec.Addr)
		r, err = run(ctx, s, true, "true")
		p.errCheck("fast_exec_after_load_"+spec.ID, errors.Join(err, want(r.code == 0, "exit %d", r.code)))
	}
	_, err = rt.Load("ghost", p.specFor("ghost", false, runtime.Limits{}))
	p.emit("load_unknown_gone", errors.Is(err, runtime.ErrGone), "error", fmt.Sprint(err))
	err = rt.Reap(ctx, "ghost", p.specFor("ghost", false, runtime.Limits{}))
	p.errCheck("reap_unknown", err) // nothing left is not an error

	if b := loaded["b"]; b != nil {
		p.checkInitSIGTERM(ctx, b)
	}
	for id, s := range loaded {
		t := time.Now()
		spec := specs[slices.IndexFunc(specs, func(x runtime.SessionSpec) bool { return x.ID == id })]
		check := "destroy_" + id
		var err, err2 error
		if id == "a" {
			// a's handle is dropped, its init running (a destroy that
			// failed, then lost track of): Reap finds it by id and removes
			// all of it; a second Reap finds nothing.
			check = "reap_" + id
			err = rt.Reap(ctx, id, spec)
			err2 = rt.Reap(ctx, id, spec)
			if _, lerr := rt.Load(id, spec); !errors.Is(lerr, runtime.ErrGone) {
				err2 = errors.Join(err2, fmt.Errorf("load after reap: %v", lerr))
			}
		} else {
			err = s.Destroy(ctx)
			err2 = s.Destroy(ctx)
		}
		_, upperErr := os.Stat(filepath.Join(spec.Dir, "root", "upper", "etc", "eos-probe"))
		p.errCheck(check, errors.Join(err, err2,
			want(!cgroupLeft(id), "cgroup left"),
			want(!mounted(filepath.Join(spec.Dir, "root", "merged")), "root still mounted"),
			want(!linkExists(id), "veth left"),
			want(id != "a" || upperErr == nil, "upper dir lost")),
			"ms", ms(time.Since(t)))
	}
	p.checkReapHalfDestroyed(ctx, rt)
	ids, err = rt.Sessions()
	p.errCheck("sessions_empty", errors.Join(err, want(len(ids) == 0, "left: %v", ids)))
	return p.done()
}

// checkReapHalfDestroyed: an isolated session destroyed part way (its veth
// gone, its init and processes alive, its handle dropped: a destroy that
// failed after removing its network) is refused by Load, and Reap removes
// the rest: its processes, cgroup and root mount; a Load then finds it gone.
func (p *probe) checkReapHalfDestroyed(ctx context.Context, rt *runtime.Runtime) {
	spec := p.specFor("d", true, runtime.Limits{})
	s, err := rt.Start(ctx, spec)
	if !p.errCheck("reap_half_destroyed", err) {
		return
	}
	spec.Addr = s.IP()
	pid, err := s.InitPid()
	if err == nil {
		err = deleteLinks("d")
	}
	if err != nil {
		p.errCheck("reap_half_destroyed", err)
		return
	}
	before := running(pid)
	_, lerr := rt.Load("d", spec)
	t := time.Now()
	err = rt.Reap(ctx, "d", spec)
	_, gone := rt.Load("d", spec)
	p.errCheck("reap_half_destroyed", errors.Join(err,
		want(before, "init %d not running before the reap", pid),
		want(lerr != nil, "load of a session without its veth succeeded"),
		want(!running(pid), "init %d still runs", pid),
		want(!cgroupLeft("d"), "cgroup left"),
		want(!mounted(filepath.Join(spec.Dir, "root", "merged")), "root still mounted"),
		want(!linkExists("d"), "veth left"),
		want(errors.Is(gone, runtime.ErrGone), "load after reap: %v", gone)),
		"load_error", fmt.Sprint(lerr), "ms", ms(time.Since(t)))
}

// running reports whether process pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(rest, "Z")
}

// deleteLinks deletes session id's veth (its host end; the peer goes with it).
func deleteLinks(id string) error {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return err
	}
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "eos-"+id) {
			l, err := netlink.LinkByName(e.Name())
			if err == nil {
				err = netlink.LinkDel(l)
			}
			if err != nil {
				return fmt.Errorf("delete %s: %w", e.Name(), err)
			}
			n++
		}
	}
	return want(n == 1, "%d veths of session %s", n, id)
}

// checkInitSIGTERM: the session init, sent SIGTERM, terminates the other
// processes of the session and exits.
func (p *probe) checkInitSIGTERM(ctx context.Context, s *runtime.Session) {
	pr, err := s.Exec(ctx, runtime.ProcSpec{Args: []string{"sleep", "100"}})
	if !p.errCheck("sessinit_sigterm_start", err) {
		return
	}
	pid, err := s.InitPid()
	if err == nil {
		err = syscall.Kill(pid, syscall.SIGTERM)
	}
	t := time.Now()
	code, werr := pr.Wait()
	exited := false
	for i := 0; i < 300 && !exited; i++ {
		exited = !running(pid)
		time.Sleep(10 * time.Millisecond)
	}
	p.errCheck("sessinit_sigterm", errors.Join(err, werr, want(code == -15, "sleep exit %d", code), want(exited, "init still running")),
		"sleep_exit", code, "ms", ms(time.Since(t)))
}

func want(cond bool, format string, args ...any) error {
	if cond {
		return nil
	}
	return fmt.Errorf(format, args...)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func percentile(ds []time.Duration, q float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return ms(s[int(q*float64(len(s)-1)+0.5)])
}

func (p *probe) checkLatency(ctx context.Context, s *runtime.Session) {
	for _, via := range []bool{false, true} {
		name := "exec_latency_libcontainer"
		if via {
			name = "exec_latency_via_init"
		}
		var ds []time.Duration
		var firstErr error
		fails := 0
		for i := 0; i < p.n; i++ {
			t := time.Now()
			r, err := run(ctx, s, via, "true")
			ds = append(ds, time.Since(t))
			if err == nil && r.code != 0 {
				err = fmt.Errorf("exit %d: %s", r.code, r.errOut)
			}
			if err != nil {
				fails++
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		p.emit(name, fails == 0, "runs", len(ds), "fails", fails, "first_error", fmt.Sprint(firstErr),
			"p50_ms", percentile(ds, 0.5), "p95_ms", percentile(ds, 0.95), "min_ms", percentile(ds, 0))
	}
}

// checkParallelExec runs execs from many goroutines at once, both paths,
// each echoing its own token.
func (p *probe) checkParallelExec(ctx context.Context, s *runtime.Session) {
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	t := time.Now()
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				tok := fmt.Sprintf("t%d-%d", g, i)
				r, err := run(ctx, s, (g+i)%2 == 0, "echo", tok)
				if err == nil && r.out != tok+"\n" {
					err = fmt.Errorf("%s: got %q exit %d", tok, r.out, r.code)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	p.errCheck("parallel_exec", errors.Join(all...), "execs", 64, "ms", ms(time.Since(t)))
}

func (p *probe) checkRootIsolation(ctx context.Context, a, b *runtime.Session) {
	ra, err := sh(ctx, a, "echo from-a > /etc/eos-probe && cat /etc/eos-probe")
	rb, err2 := sh(ctx, b, "cat /etc/eos-probe 2>&1; echo rc=$?")
	p.errCheck("etc_write_private", errors.Join(err, err2,
		want(strings.TrimSpace(ra.out) == "from-a", "a reads %q", ra.out),
		want(!strings.Contains(rb.out, "from-a") && strings.Contains(rb.out, "rc=1"), "b reads %q", rb.out)),
		"a", strings.TrimSpace(ra.out), "b", strings.TrimSpace(rb.out))
	_, statErr := os.Stat("/etc/eos-probe")
	p.emit("etc_write_not_in_sandbox", errors.Is(statErr, os.ErrNotExist))
	r, err := sh(ctx, a, "hostname; cat /etc/hostname")
	p.errCheck("hostname", errors.Join(err, want(r.out == "a\na\n", "got %q", r.out)))
}

func (p *probe) checkWorkspace(ctx context.Context, a *runtime.Session, spec runtime.SessionSpec) {
	err := os.WriteFile(filepath.Join(spec.Workspace, "from-host.txt"), []byte("hello\n"), 0o644)
	r, err2 := sh(ctx, a, "cat /workspace/from-host.txt && echo made > /workspace/from-session.txt && pwd")
	back, err3 := os.ReadFile(filepath.Join(spec.Workspace, "from-session.txt"))
	p.errCheck("workspace_bind", errors.Join(err, err2, err3,
		want(r.out == "hello\n/workspace\n", "session sees %q", r.out),
		want(string(back) == "made\n", "host sees %q", back)))
}

// checkWorkspaceFollows: a mount the daemon makes on the (anchored)
// workspace after the session started reaches the session's /workspace,
// and so does its unmount (how the daemon mounts a session's overlay, and
// later one in its place).
func (p *probe) checkWorkspaceFollows(ctx context.Context, a *runtime.Session, spec runtime.SessionSpec) {
	ws := spec.Workspace
	err := unix.Mount("tmpfs", ws, "tmpfs", 0, "size=64k")
	if err == nil {
		err = os.WriteFile(filepath.Join(ws, "on-top.txt"), []byte("top\n"), 0o644)
	}
	r1, err1 := sh(ctx, a, "cat /workspace/on-top.txt; test -e /workspace/from-host.txt || echo covered")
	err2 := unix.Unmount(ws, 0)
	r2, err3 := sh(ctx, a, "cat /workspace/from-host.txt; test -e /workspace/on-top.txt || echo gone")
	p.errCheck("workspace_follows", errors.Join(err, err1, err2, err3,
		want(r1.out == "top\ncovered\n", "after the mount the session sees %q", r1.out),
		want(r2.out == "hello\ngone\n", "after the unmount the session sees %q", r2.out)))
}

// checkFreeze: while frozen, a busy loop of the session stops counting;
// freezes nest; after the last thaw it counts again.
func (p *probe) checkFreeze(ctx context.Context, a *runtime.Session, spec runtime.SessionSpec) {
	cnt := filepath.Join(spec.Workspace, "freeze-count")
	r, err := sh(ctx, a, "(i=0; while :; do i=$((i+1)); echo $i > /workspace/freeze-count; done) >/dev/null 2>&1 & echo $!")
	loop := strings.TrimSpace(r.out)
	read := func() string { b, _ := os.ReadFile(cnt); return strings.TrimSpace(string(b)) }
	moving := func() bool {
		v := read()
		for i := 0; i < 200; i++ {
			time.Sleep(10 * time.Millisecond)
			if w := read(); w != v && w != "" {
				return true
			}
		}
		return false
	}
	errs := []error{err, want(moving(), "the loop never counted")}
	if !cgroups.IsCgroup2UnifiedMode() {
		// v1's freezer holds tasks even against SIGKILL: refused.
		_, ferr := a.Freeze()
		errs = append(errs, want(errors.Is(ferr, runtime.ErrFreezeUnkillable), "cgroup v1: Freeze answered %v", ferr), want(moving(), "counting stopped"))
		_, kerr := sh(ctx, a, "kill "+loop)
		p.errCheck("freeze", errors.Join(append(errs, kerr)...))
		return
	}
	thaw1, err := a.Freeze()
	errs = append(errs, err)
	if err == nil {
		thaw2, err := a.Freeze()
		errs = append(errs, err, want(a.Frozen(), "not frozen"))
		time.Sleep(50 * time.Millisecond)
		errs = append(errs, want(!moving(), "counting while frozen"))
		if err == nil {
			thaw2()
		}
		errs = append(errs, want(a.Frozen(), "one thaw of two thawed it"))
		thaw1()
		thaw1() // idempotent
		errs = append(errs, want(!a.Frozen(), "still frozen after the last thaw"), want(moving(), "not counting after the thaw"))
	}
	_, kerr := sh(ctx, a, "kill "+loop)
	p.errCheck("freeze", errors.Join(append(errs, kerr)...))
}

func (p *probe) checkPrivileges(ctx context.Context, a *runtime.Session) {
	const wantCaps = "00000000a80425fb" // Docker's default set
	for _, via := range []bool{false, true} {
		suffix := ""
		if via {
			suffix = "_via_init"
		}
		r, err := run(ctx, a, via, "grep", "-E", "^(CapEff|CapBnd|CapPrm|NoNewPrivs):", "/proc/self/status")
		f := statusFields(r.out)
		p.errCheck("caps"+suffix, errors.Join(err,
			want(f["CapEff"] == wantCaps && f["CapBnd"] == wantCaps, "caps %v", f),
			want(f["NoNewPrivs"] == "1", "NoNewPrivs %q", f["NoNewPrivs"])),
			"CapEff", f["CapEff"], "CapBnd", f["CapBnd"], "NoNewPrivs", f["NoNewPrivs"])
	}
	p.checkSeccomp(ctx, a)
	r, err := sh(ctx, a, "echo $$; cat /proc/1/cmdline | tr '\\0' ' '")
	p.errCheck("pid_namespace", errors.Join(err, want(strings.Contains(r.out, "sessinit"), "pid 1 is %q", r.out)),
		"out", strings.TrimSpace(r.out))
}

func statusFields(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func (p *probe) checkHidden(ctx context.Context, a *runtime.Session) {
	r, err := sh(ctx, a, fmt.Sprintf("ls -A %[1]s | wc -l; touch %[1]s/x 2>/dev/null; echo rc=$?; stat -c %%a %[1]s", p.state))
	f := strings.Fields(r.out)
	p.errCheck("hidden_state_dir", errors.Join(err,
		want(len(f) == 3 && f[0] == "0" && f[1] != "rc=0" && f[2] == "0", "got %q", r.out)),
		"out", strings.Join(f, " "))
	// Masked /proc files exist on some kernels only; those present read empty.
	r, err = sh(ctx, a, "for f in /proc/kcore /proc/timer_list /proc/sched_debug /proc/keys; do [ -e $f ] && wc -c < $f; done; "+
		"ls /sys/firmware | wc -l; echo x > /proc/sys/kernel/hostname; echo rc=$?")
	lines := strings.Fields(r.out)
	p.errCheck("masked_paths", errors.Join(err, want(len(lines) >= 3 && strings.Trim(strings.Join(lines[:len(lines)-1], ""), "0") == "" &&
		strings.HasPrefix(lines[len(lines)-1], "rc=") && lines[len(lines)-1] != "rc=0", "got %q %q", r.out, r.errOut)),
		"out", strings.Join(lines, " "))
}

func (p *probe) checkLimits(ctx context.Context, c *runtime.Session) {
	paths, err := c.CgroupPaths()
	if !p.errCheck("cgroup_paths", err, "paths", paths) {
		return
	}
	var pidsMax, memMax, cpu string
	if dir, ok := paths[""]; ok { // v2
		pidsMax, memMax, cpu = readTrim(dir, "pids.max"), readTrim(dir, "memory.max"), readTrim(dir, "cpu.max")
	} else {
		pidsMax = readTrim(paths["pids"], "pids.max")
		memMax = readTrim(paths["memory"], "memory.limit_in_bytes")
		cpu = readTrim(paths["cpu"], "cpu.cfs_quota_us") + " " + readTrim(paths["cpu"], "cpu.cfs_period_us")
	}
	p.errCheck("cgroup_limits_written", errors.Join(
		want(pidsMax == "64", "pids.max %q", pidsMax),
		want(memMax == strconv.Itoa(128<<20), "memory %q", memMax),
		want(cpu == "50000 100000", "cpu %q", cpu)),
		"pids_max", pidsMax, "memory", memMax, "cpu", cpu)

	r, err := sh(ctx, c, "i=0; while [ $i -lt 100 ]; do sleep 1 & i=$((i+1)); done; wait; echo loop-done")
	p.errCheck("pids_limit_enforced", errors.Join(err,
		want(strings.Contains(r.errOut, "fork") || strings.Contains(r.errOut, "emporarily"), "no fork failure: %q", head(r.errOut))),
		"stderr_sample", head(r.errOut))
	// The fork bomb's sleeps outlive a shell that gave up: wait for them.
	pidsDir := paths["pids"] + paths[""] // v1 or v2
	var cur string
	for i := 0; i < 500; i++ {
		if cur = readTrim(pidsDir, "pids.current"); len(cur) < 3 && cur < "20" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.emit("info_pids_after_fork_bomb", true, "pids_current", cur)
	r, err = sh(ctx, c, "dd if=/dev/zero of=/dev/null bs=200M count=1")
	p.errCheck("memory_limit_enforced", errors.Join(err, want(r.code != 0, "dd of 200M passed a 128M limit")),
		"exit", r.code, "stderr", head(r.errOut))
}

func readTrim(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "ERR " + err.Error()
	}
	return strings.TrimSpace(string(b))
}

func head(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 160 {
		return s[:160]
	}
	return s
}

func (p *probe) checkNetwork(ctx context.Context, a, b, c *runtime.Session) {
	p.emit("isolated_has_ip", b.IP() != "" && c.IP() != "" && b.IP() != c.IP() && a.IP() == "",
		"a", a.IP(), "b", b.IP(), "c", c.IP())
	rb, err := sh(ctx, b, "ls /sys/class/net | tr '\\n' ' '")
	p.errCheck("isolated_interfaces", errors.Join(err, want(strings.TrimSpace(rb.out) == "eth0 lo", "got %q", rb.out)),
		"b", strings.TrimSpace(rb.out))

	exe, _ := os.Executable()
	const port = "18080"
	var servers []*runtime.Proc
	for _, x := range []struct {
		s    *runtime.Session
		text string
	}{{a, "A"}, {b, "B"}, {c, "C"}} {
		pr, err := x.s.Exec(ctx, runtime.ProcSpec{Args: []string{exe, "serve", port, x.text}, Stderr: os.Stderr})
		if !p.errCheck("serve_"+x.text, err) {
			return
		}
		servers = append(servers, pr)
	}
	defer func() {
		for _, pr := range servers {
			_ = pr.Signal(syscall.SIGKILL)
			_, _ = pr.Wait()
		}
	}()
	sandboxDial := (&net.Dialer{}).DialContext
	got := func(dial func(context.Context, string, string) (net.Conn, error), addr string) string {
		var out string
		for i := 0; i < 100; i++ { // the servers need a moment to listen
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err := dial(dctx, "tcp", addr)
			cancel()
			if err == nil {
				b, _ := io.ReadAll(conn)
				_ = conn.Close()
				return string(b)
			}
			out = err.Error()
			time.Sleep(10 * time.Millisecond)
		}
		return out
	}
	// Isolated sessions only from inside their own namespace (the forward
	// route's way): the sandbox's namespace opens nothing to them.
	ga, gb, gc := got(sandboxDial, "127.0.0.1:"+port), got(b.DialContext, net.JoinHostPort(b.IP(), port)), got(c.DialContext, net.JoinHostPort(c.IP(), port))
	p.emit("same_port_three_sessions", ga == "A" && gb == "B" && gc == "C", "shared", ga, "b", gb, "c", gc)
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	conn, err := sandboxDial(dctx, "tcp", net.JoinHostPort(b.IP(), port))
	cancel()
	if err == nil {
		_ = conn.Close()
	}
	p.errCheck("sandbox_cannot_reach_isolated", want(err != nil, "the sandbox's namespace connected to %s", b.IP()))

	// From an isolated session: the sandbox (and so shared sessions) through
	// the gateway, but never another isolated session, whatever ip_forward
	// says (the sandbox's nftables rules drop traffic between sessions).
	gw := gatewayOf(b.IP())
	r, err := run(ctx, b, false, exe, "dial", net.JoinHostPort(gw, port))
	p.errCheck("isolated_reaches_sandbox", errors.Join(err, want(r.out == "A", "got %q %q", r.out, r.errOut)), "out", r.out)
	fwd := readTrim("/proc/sys/net/ipv4", "ip_forward")
	r, err = run(ctx, b, false, exe, "dial", net.JoinHostPort(c.IP(), port))
	p.errCheck("isolated_cannot_reach_isolated", want(err == nil && r.code != 0 && r.out != "C", "got %q %q (exit %d, %v)", r.out, r.errOut, r.code, err),
		"out", r.out, "err_out", r.errOut, "ip_forward", fwd)
}

func gatewayOf(ip string) string {
	a := net.ParseIP(ip).To4()
	if a == nil {
		return ""
	}
	a[3]--
	return a.String()
}

func (p *probe) checkTTY(ctx context.Context, a *runtime.Session) {
	var out syncBuffer
	pr, err := a.Exec(ctx, runtime.ProcSpec{
		Args: []string{"sh", "-c", "tty; stty size; read x; stty size"},
		TTY:  true, Rows: 30, Cols: 100, Stdout: &out,
	})
	if !p.errCheck("tty_start", err) {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "30 100") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	rerr := pr.Resize(40, 120)
	_, werr := pr.Stdin().Write([]byte("\n"))
	code, err := pr.Wait()
	s := out.String()
	p.errCheck("tty", errors.Join(err, rerr, werr, want(code == 0, "exit %d", code),
		want(strings.Contains(s, "/dev/pts/0") && strings.Contains(s, "30 100") && strings.Contains(s, "40 120"), "got %q", s)),
		"out", strings.ReplaceAll(strings.TrimSpace(s), "\r\n", " | "))
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (p *probe) checkSignals(ctx context.Context, a *runtime.Session) {
	for _, via := range []bool{false, true} {
		suffix := ""
		if via {
			suffix = "_via_init"
		}
		pr, err := a.Exec(ctx, runtime.ProcSpec{Args: []string{"sh", "-c", "sleep 30; true"}, ViaInit: via})
		if !p.errCheck("signal_start"+suffix, err) {
			continue
		}
		time.Sleep(50 * time.Millisecond)
		serr := pr.Signal(syscall.SIGTERM)
		code, err := pr.Wait()
		p.errCheck("signal_group"+suffix, errors.Join(serr, err, want(code == -15, "exit %d", code)), "exit", code)

		r, err := run(ctx, a, via, "sh", "-c", "exit 7")
		p.errCheck("exit_code"+suffix, errors.Join(err, want(r.code == 7, "exit %d", r.code)))

		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		pr, err = a.Exec(cctx, runtime.ProcSpec{Args: []string{"sleep", "30"}, ViaInit: via})
		if err == nil {
			code, err = pr.Wait()
		}
		cancel()
		p.errCheck("context_kills"+suffix, errors.Join(err, want(code == -9, "exit %d", code)))

		var o bytes.Buffer
		pr, err = a.Exec(ctx, runtime.ProcSpec{Args: []string{"sh", "-c", "read x; echo got-$x"}, Stdout: &o, ViaInit: via})
		if err == nil {
			_, _ = pr.Stdin().Write([]byte("hi\n"))
			_ = pr.Stdin().Close()
			code, err = pr.Wait()
		}
		p.errCheck("stdin_pipe"+suffix, errors.Join(err, want(o.String() == "got-hi\n" && code == 0, "got %q exit %d", o.String(), code)))
	}
	pids, err := a.Pids()
	p.errCheck("pids", errors.Join(err, want(len(pids) >= 1, "no pids")), "count", len(pids))
}

func cgroupLeft(id string) bool {
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/sessions/" + id)
	m2, _ := filepath.Glob("/sys/fs/cgroup/sessions/" + id)
	return len(matches)+len(m2) > 0
}

func mounted(path string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func linkExists(id string) bool {
	ents, _ := os.ReadDir("/sys/class/net")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "eos-"+id) {
			return true
		}
	}
	return false
}

func serve(port, text string) int {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return 1
		}
		_, _ = conn.Write([]byte(text))
		_ = conn.Close()
	}
}

func dial(addr string) int {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	b, _ := io.ReadAll(conn)
	_, _ = os.Stdout.Write(b)
	return 0
}
