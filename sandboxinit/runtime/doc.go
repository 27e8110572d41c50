// Package runtime runs workspace sessions as libcontainer containers inside the
// sandbox's Docker container, where the daemon binary is PID 1.
//
// A session is a container with its own mount, pid, ipc and uts namespaces
// (and its own network namespace when isolated), a private root, reduced
// capabilities, no_new_privs, its own seccomp filter and cgroup limits. The daemon calls this package;
// nothing here talks to Docker.
//
// The daemon's main must start with
//
//	runtime.InitMain()                // becomes "runc init" when re-executed as "<argv0> init"
//	if len(os.Args) > 1 && os.Args[1] == "sessinit" {
//		os.Exit(runtime.SessionInitMain(os.Args[2:]))
//	}
//
// and the sandbox container needs the capabilities New names in its error,
// sandboxinit/runtime/seccomp.json as its seccomp profile, a volume for the
// state, net.ipv4.ip_forward=1 for isolated sessions to reach beyond the
// sandbox, and nf_tables in the kernel for isolated sessions at all. The binary must be built with cgo and the "seccomp" tag against
// libseccomp (statically: CGO_ENABLED=1 go build -tags 'seccomp osusergo
// netgo' -ldflags '-linkmode external -extldflags -static'; libseccomp-dev
// from scripts/ensure-build-deps.sh); without it New refuses.
//
// Invariants:
//
//   - runc's libcontainer (pinned to v1.5.3) is used only from libcontainer_linux.go.
//     It re-executes /proc/self/exe as "init" for every session start and
//     every libcontainer exec; that process must become "runc init" before
//     doing anything else (InitMain, which also dispatches "sessexec").
//   - A session's root is an overlay with lowerdir "/" (the sandbox
//     container's root) and upper and work dirs under SessionSpec.Dir/root, so
//     package installs and /etc edits stay private to the session and survive
//     daemon restarts. Dir must be on a real file system (the state volume):
//     an overlay upper dir on Docker's own overlay root does not work.
//     Everything on the sandbox's root file system is readable by sessions;
//     secrets belong on the state volume, which SessionSpec.Hidden masks.
//   - The session init (SessionInitMain) is PID 1 of the session's pid
//     namespace: it reaps orphans, because a zombie holds a pids.max slot and
//     a session full of zombies can no longer exec. It also serves the fast
//     exec path (fastexec.go) on a listening socket the daemon creates at
//     Dir/exec.sock and hands over as fd 3; sessions cannot see Dir.
//   - Sessions keep Docker's default capability set without SYS_ADMIN (so
//     they cannot mount or unshare a mount namespace) and run with
//     no_new_privs.
//   - Every session process runs under the session's own seccomp filter,
//     stacked on the sandbox's: Docker's default profile as Docker resolves
//     it for a container with the session's capabilities (seccomp_linux.go derives
//     it from the embedded seccomp.json, whose rules for the sandbox's extra
//     needs are conditioned on CAP_SYS_ADMIN). So unshare, setns, mount,
//     umount2, pivot_root, clone with namespace flags, keyctl, add_key,
//     request_key, bpf, perf_event_open, module and kexec syscalls,
//     open_by_handle_at, userfaultfd and every unlisted syscall fail with
//     EPERM, clone3 with ENOSYS (libcs fall back to clone), and ptrace works
//     (kernel >= 4.8): a session cannot create a user namespace. New
//     compiles the filter once per daemon (seccompbpf_linux.go: runc's
//     libseccomp steps and its -ENOSYS stub; runc init used to compile it
//     for every start and libcontainer exec, ~9 ms each) into a sealed
//     memfd. The session's init is the daemon binary started by descriptor
//     (never a path in the session's writable root); it loads the filter on
//     all its threads before anything else and reports, and Start checks
//     /proc/<pid>/status for one filter more than the daemon's.
//     libcontainer execs (TTY) go through "sessexec", which loads it and
//     execs the command; fast-path processes inherit it from the session
//     init, which forks them (seccompload_linux.go). Sessions started by a binary without this
//     filter stay unfiltered until restarted (Load logs a warning).
//   - Session cgroups are named relative ("sessions/<id>") so they resolve
//     under the daemon's own cgroup. On cgroup v2 New first moves the daemon
//     into a "daemon" leaf next to "sessions" (the no-internal-process rule).
//   - Nothing about a session is persisted by this package beyond
//     libcontainer's state dir under the state root and the root overlay's
//     upper dir: the caller keeps its own metadata (for example the
//     isolated session's address, see SessionSpec.Addr) and passes the same
//     SessionSpec to Load after a daemon restart.
//   - Destroy is idempotent and never removes SessionSpec.Dir's upper dir:
//     the caller owns the session's data.
//   - Isolated sessions never reach each other: New writes the sandbox's
//     nftables table "eos" (firewall.go, through github.com/google/nftables)
//     whose forward chain drops every packet between two sessions' veths,
//     and masquerades the session pool out of the sandbox. Where that
//     table cannot be written (no nf_tables, no NET_ADMIN) Start refuses
//     isolated sessions (ErrUnsupported wrapping ErrNoNftables) instead of
//     starting them unisolated; shared sessions are unaffected. They still
//     reach the sandbox itself through their gateway (so the daemon and
//     shared sessions' servers). Nothing in the sandbox's namespace opens a
//     connection to them (shared sessions live there): its output chain
//     drops anything new towards a session's veth and each session's own
//     namespace accepts nothing new from eth0 (table "eos_in"). The
//     daemon's forward route dials from inside the session's namespace
//     (Session.DialContext).
//   - Isolated sessions resolve names through a forwarder of the daemon on
//     their gateway, port 53 (dns_linux.go), named in their /etc/resolv.conf;
//     egress none gets no resolver.
//   - An isolated session's SessionSpec.Egress other than the default is a
//     table "eos_s_<id>" of its own (input and forward, before "eos"):
//     replies to connections the sandbox opened pass, then the allow-list
//     (TCP and UDP to cidr:port), then everything else from its veth is
//     dropped. It is written before the session's init starts, rewritten
//     by Load and removed by Destroy; each change is one atomic batch.
//
// The daemon as PID 1 must not reap with wait4(-1) blindly: libcontainer
// execs and libcontainer's helper processes are its direct children and this
// package waits for them by pid. Reap only pids nobody waits for (for example
// peek with waitid(P_ALL, WNOWAIT) against a set of pids in flight).
package runtime
