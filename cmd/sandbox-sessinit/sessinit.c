// sandbox-sessinit: a workspace session's PID 1, the process an idle
// session is. It holds the session's namespaces, reaps its orphans and
// forks its commands for the daemon's fast exec path. It is C, one thread,
// no runtime, because an idle session costs what this process costs: the
// Go version of the same init (package sandboxinit/runtime/sessinit, which
// the daemon binary still runs as "sessinit" where this binary is missing)
// held about 580 KiB of anonymous memory and 5 threads per idle session.
//
// The protocol and the rules are the Go package's, which documents them:
//
//   - It refuses to run unless it is PID 1 (its shutdown signals every
//     process it can see).
//   - EOS_EXE_FD: the descriptor it was started from; closed at once.
//   - EOS_SECCOMP_FD: a sealed memfd with the session's compiled seccomp
//     program ("EOSBPF1\n", flags u32, count u32, count 8-byte
//     instructions, native order); loaded before anything else, and the
//     result reported on EOS_READY_FD ("ok\n" or "error: ...\n").
//   - EOS_EXEC_FD: a listening SOCK_SEQPACKET socket. Each connection sends
//     one request, JSON {"args":[...],"env":[...],"cwd":"..."} of at most
//     256 KiB with the process's stdin, stdout and stderr as SCM_RIGHTS;
//     the answer is {"pid":N} with a pidfd (or {"error":"..."}), then
//     {"exit":N} when it exits (-signal when killed by one).
//   - SIGTERM or SIGINT: SIGTERM to every other process, SIGKILL to what is
//     left after 2 s, exit 0 once none is left.
//
// Every byte a request carries is checked here as if a stranger sent it:
// only the daemon can reach the socket, but a bad request must never crash
// the process whose exit ends the session.
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef SECCOMP_FILTER_FLAG_TSYNC
#define SECCOMP_FILTER_FLAG_TSYNC 1
#endif

#define MAX_REQUEST (256 << 10)
#define MAX_FILTER (1 << 20)
#define SHUTDOWN_GRACE_MS 2000
#define MAX_DEPTH 32
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

extern char **environ;

// ---------------------------------------------------------------------------
// Small helpers.

static void *xrealloc(void *p, size_t n) {
	void *q = realloc(p, n ? n : 1);
	if (!q) {
		// Out of memory in a session's init: nothing sensible is left to do
		// but to say so; the session ends with it.
		static const char msg[] = "sessinit: out of memory\n";
		(void)!write(2, msg, sizeof msg - 1);
		_exit(1);
	}
	return q;
}

// A growable byte buffer.
struct buf {
	char *b;
	size_t n, cap;
};

static void buf_put(struct buf *s, const char *p, size_t n) {
	if (s->n + n + 1 > s->cap) {
		s->cap = (s->n + n + 1) * 2;
		s->b = xrealloc(s->b, s->cap);
	}
	memcpy(s->b + s->n, p, n);
	s->n += n;
	s->b[s->n] = 0;
}

static void buf_printf(struct buf *s, const char *fmt, ...) {
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	buf_put(s, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// envfd reads descriptor variable name (and unsets it): -1 when absent,
// -2 when it is not a number of at least min.
static int envfd(const char *name, int min) {
	const char *v = getenv(name);
	if (!v)
		return -1;
	char *end;
	errno = 0;
	long fd = strtol(v, &end, 10);
	int bad = errno || end == v || *end || fd < min || fd > 1 << 20;
	unsetenv(name);
	return bad ? -2 : (int)fd;
}

static int64_t now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
	}
}

// errstr is errno's text as Go spells it (lower case first letter), so the
// daemon's messages read the same whichever init answered.
static const char *errstr(int e, char *tmp, size_t n) {
	snprintf(tmp, n, "%s", strerror(e));
	if (tmp[0])
		tmp[0] = (char)tolower((unsigned char)tmp[0]);
	return tmp;
}

// ---------------------------------------------------------------------------
// The seccomp filter.

// load_filter loads the program the daemon handed over. It returns 0 when
// there is none or it loaded, else -1 with the reason in why.
static int load_filter(char *why, size_t n) {
	int exe = envfd("EOS_EXE_FD", 3);
	if (exe >= 3)
		close(exe);
	const char *v = getenv("EOS_SECCOMP_FD");
	if (!v)
		return 0;
	int fd = envfd("EOS_SECCOMP_FD", 3);
	if (fd < 0) {
		snprintf(why, n, "bad EOS_SECCOMP_FD");
		return -1;
	}
	struct stat st;
	char tmp[128];
	if (fstat(fd, &st) < 0) {
		snprintf(why, n, "seccomp filter fd: %s", errstr(errno, tmp, sizeof tmp));
		close(fd);
		return -1;
	}
	if (st.st_size <= 0 || st.st_size > MAX_FILTER) {
		snprintf(why, n, "seccomp filter fd: %lld bytes", (long long)st.st_size);
		close(fd);
		return -1;
	}
	size_t size = (size_t)st.st_size;
	unsigned char *b = xrealloc(NULL, size);
	ssize_t got = pread(fd, b, size, 0);
	close(fd);
	if (got != (ssize_t)size) {
		snprintf(why, n, "read seccomp filter: %s", got < 0 ? errstr(errno, tmp, sizeof tmp) : "short read");
		free(b);
		return -1;
	}
	static const char magic[] = "EOSBPF1\n";
	size_t ml = sizeof magic - 1;
	if (size < ml + 8 || memcmp(b, magic, ml) != 0) {
		snprintf(why, n, "not a compiled seccomp filter");
		free(b);
		return -1;
	}
	uint32_t flags, count;
	memcpy(&flags, b + ml, 4);
	memcpy(&count, b + ml + 4, 4);
	if (count == 0 || count > BPF_MAXINSNS || size - ml - 8 != (size_t)count * 8) {
		snprintf(why, n, "compiled seccomp filter: %u instructions in %zu bytes", count, size - ml - 8);
		free(b);
		return -1;
	}
	struct sock_filter *prog = xrealloc(NULL, count * sizeof *prog);
	for (uint32_t i = 0; i < count; i++) {
		const unsigned char *in = b + ml + 8 + 8 * (size_t)i;
		memcpy(&prog[i].code, in, 2);
		prog[i].jt = in[2];
		prog[i].jf = in[3];
		memcpy(&prog[i].k, in + 4, 4);
	}
	free(b);
	struct sock_fprog fprog = {.len = (unsigned short)count, .filter = prog};
	long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, (unsigned long)flags | SECCOMP_FILTER_FLAG_TSYNC, &fprog);
	int e = errno;
	free(prog);
	if (r != 0) {
		if (r < 0)
			snprintf(why, n, "load seccomp filter: %s", errstr(e, tmp, sizeof tmp));
		else
			snprintf(why, n, "load seccomp filter: thread %ld could not be synchronised", r);
		return -1;
	}
	return 0;
}

static void report_ready(const char *err) {
	int fd = envfd("EOS_READY_FD", 3);
	if (fd < 0)
		return;
	struct buf m = {0};
	if (!err) {
		buf_put(&m, "ok\n", 3);
	} else {
		buf_put(&m, "error: ", 7);
		for (const char *p = err; *p; p++)
			buf_put(&m, *p == '\n' ? " " : p, 1);
		buf_put(&m, "\n", 1);
	}
	(void)!write(fd, m.b, m.n);
	close(fd);
	free(m.b);
}

// ---------------------------------------------------------------------------
// The request: a strict reader of the JSON the daemon writes.

struct strs {
	char **v; // NUL-terminated, v[n] == NULL
	size_t n;
	int nul; // one of them holds a NUL byte (execve cannot take it)
};

struct request {
	struct strs args, env;
	char *cwd;
	int cwd_nul;
};

struct parser {
	const char *p, *end;
	const char *err;
};

static void strs_free(struct strs *s) {
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	memset(s, 0, sizeof *s);
}

static void request_free(struct request *r) {
	strs_free(&r->args);
	strs_free(&r->env);
	free(r->cwd);
	memset(r, 0, sizeof *r);
}

static void ws(struct parser *ps) {
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int fail(struct parser *ps, const char *why) {
	if (!ps->err)
		ps->err = why;
	return -1;
}

static int lit(struct parser *ps, const char *word) {
	size_t n = strlen(word);
	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
		return fail(ps, "invalid literal");
	ps->p += n;
	return 0;
}

static int hex4(struct parser *ps, unsigned *out) {
	if (ps->end - ps->p < 4)
		return fail(ps, "short \\u escape");
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		char c = *ps->p++;
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (unsigned)(c - 'A' + 10);
		else
			return fail(ps, "bad \\u escape");
	}
	*out = v;
	return 0;
}

static void put_utf8(struct buf *b, unsigned c) {
	char u[4];
	size_t n;
	if (c < 0x80) {
		u[0] = (char)c, n = 1;
	} else if (c < 0x800) {
		u[0] = (char)(0xC0 | (c >> 6)), u[1] = (char)(0x80 | (c & 0x3F)), n = 2;
	} else if (c < 0x10000) {
		u[0] = (char)(0xE0 | (c >> 12)), u[1] = (char)(0x80 | ((c >> 6) & 0x3F)), u[2] = (char)(0x80 | (c & 0x3F)), n = 3;
	} else {
		u[0] = (char)(0xF0 | (c >> 18)), u[1] = (char)(0x80 | ((c >> 12) & 0x3F)), u[2] = (char)(0x80 | ((c >> 6) & 0x3F)),
		u[3] = (char)(0x80 | (c & 0x3F)), n = 4;
	}
	buf_put(b, u, n);
}

// string reads a JSON string into *out (or skips it when out is NULL);
// *nul is set when it holds a NUL byte.
static int string(struct parser *ps, char **out, int *nul) {
	ws(ps);
	if (ps->p >= ps->end || *ps->p != '"')
		return fail(ps, "want a string");
	ps->p++;
	struct buf b = {0};
	buf_put(&b, "", 0);
	while (1) {
		if (ps->p >= ps->end) {
			free(b.b);
			return fail(ps, "unterminated string");
		}
		unsigned char c = (unsigned char)*ps->p++;
		if (c == '"')
			break;
		if (c < 0x20) {
			free(b.b);
			return fail(ps, "control character in string");
		}
		if (c != '\\') {
			buf_put(&b, (const char *)&c, 1);
			continue;
		}
		if (ps->p >= ps->end) {
			free(b.b);
			return fail(ps, "unterminated escape");
		}
		char e = *ps->p++;
		switch (e) {
		case '"': buf_put(&b, "\"", 1); break;
		case '\\': buf_put(&b, "\\", 1); break;
		case '/': buf_put(&b, "/", 1); break;
		case 'b': buf_put(&b, "\b", 1); break;
		case 'f': buf_put(&b, "\f", 1); break;
		case 'n': buf_put(&b, "\n", 1); break;
		case 'r': buf_put(&b, "\r", 1); break;
		case 't': buf_put(&b, "\t", 1); break;
		case 'u': {
			unsigned u;
			if (hex4(ps, &u) < 0) {
				free(b.b);
				return -1;
			}
			if (u >= 0xD800 && u < 0xDC00) { // a surrogate pair, or U+FFFD as Go reads a lone one
				unsigned lo;
				if (ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
					const char *save = ps->p;
					ps->p += 2;
					if (hex4(ps, &lo) < 0) {
						free(b.b);
						return -1;
					}
					if (lo >= 0xDC00 && lo < 0xE000) {
						u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
					} else {
						u = 0xFFFD;
						ps->p = save;
					}
				} else {
					u = 0xFFFD;
				}
			} else if (u >= 0xDC00 && u < 0xE000) {
				u = 0xFFFD;
			}
			if (u == 0 && nul)
				*nul = 1;
			put_utf8(&b, u);
			break;
		}
		default:
			free(b.b);
			return fail(ps, "bad escape");
		}
	}
	if (out)
		*out = b.b;
	else
		free(b.b);
	return 0;
}

static int skip(struct parser *ps, int depth);

// strings reads null or an array of strings into *s (replacing it).
static int strings(struct parser *ps, struct strs *s) {
	strs_free(s);
	ws(ps);
	if (ps->p < ps->end && *ps->p == 'n')
		return lit(ps, "null");
	if (ps->p >= ps->end || *ps->p != '[')
		return fail(ps, "want an array of strings");
	ps->p++;
	ws(ps);
	if (ps->p < ps->end && *ps->p == ']') {
		ps->p++;
		return 0;
	}
	while (1) {
		char *v;
		if (string(ps, &v, &s->nul) < 0)
			return -1;
		s->v = xrealloc(s->v, (s->n + 2) * sizeof *s->v);
		s->v[s->n++] = v;
		s->v[s->n] = NULL;
		ws(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			continue;
		}
		if (ps->p < ps->end && *ps->p == ']') {
			ps->p++;
			return 0;
		}
		return fail(ps, "want , or ] in an array");
	}
}

// skip reads past any JSON value (an unknown field's).
static int skip(struct parser *ps, int depth) {
	if (depth > MAX_DEPTH)
		return fail(ps, "nested too deep");
	ws(ps);
	if (ps->p >= ps->end)
		return fail(ps, "unexpected end");
	char c = *ps->p;
	if (c == '"')
		return string(ps, NULL, NULL);
	if (c == 't')
		return lit(ps, "true");
	if (c == 'f')
		return lit(ps, "false");
	if (c == 'n')
		return lit(ps, "null");
	if (c == '-' || (c >= '0' && c <= '9')) {
		while (ps->p < ps->end && strchr("+-.eE0123456789", *ps->p))
			ps->p++;
		return 0;
	}
	if (c == '[' || c == '{') {
		char close = c == '[' ? ']' : '}';
		ps->p++;
		ws(ps);
		if (ps->p < ps->end && *ps->p == close) {
			ps->p++;
			return 0;
		}
		while (1) {
			if (close == '}') {
				if (string(ps, NULL, NULL) < 0)
					return -1;
				ws(ps);
				if (ps->p >= ps->end || *ps->p != ':')
					return fail(ps, "want : in an object");
				ps->p++;
			}
			if (skip(ps, depth + 1) < 0)
				return -1;
			ws(ps);
			if (ps->p < ps->end && *ps->p == ',') {
				ps->p++;
				continue;
			}
			if (ps->p < ps->end && *ps->p == close) {
				ps->p++;
				return 0;
			}
			return fail(ps, "want , or a closing bracket");
		}
	}
	return fail(ps, "invalid character");
}

// parse_request reads {"args":[...],"env":[...],"cwd":"..."} (other fields
// ignored, a repeated one's last value kept, as Go reads it).
static int parse_request(const char *p, size_t n, struct request *r, const char **why) {
	struct parser ps = {p, p + n, NULL};
	memset(r, 0, sizeof *r);
	ws(&ps);
	if (ps.p >= ps.end || *ps.p != '{') {
		*why = "want an object";
		return -1;
	}
	ps.p++;
	ws(&ps);
	int empty = ps.p < ps.end && *ps.p == '}';
	if (empty)
		ps.p++;
	while (!empty) {
		char *key;
		if (string(&ps, &key, NULL) < 0)
			goto bad;
		ws(&ps);
		if (ps.p >= ps.end || *ps.p != ':') {
			free(key);
			fail(&ps, "want : in an object");
			goto bad;
		}
		ps.p++;
		int rc;
		if (strcmp(key, "args") == 0) {
			rc = strings(&ps, &r->args);
		} else if (strcmp(key, "env") == 0) {
			rc = strings(&ps, &r->env);
		} else if (strcmp(key, "cwd") == 0) {
			free(r->cwd);
			r->cwd = NULL;
			ws(&ps);
			if (ps.p < ps.end && *ps.p == 'n') {
				rc = lit(&ps, "null");
			} else {
				r->cwd_nul = 0;
				rc = string(&ps, &r->cwd, &r->cwd_nul);
			}
		} else {
			rc = skip(&ps, 0);
		}
		free(key);
		if (rc < 0)
			goto bad;
		ws(&ps);
		if (ps.p < ps.end && *ps.p == ',') {
			ps.p++;
			continue;
		}
		if (ps.p < ps.end && *ps.p == '}') {
			ps.p++;
			break;
		}
		fail(&ps, "want , or } in an object");
		goto bad;
	}
	ws(&ps);
	if (ps.p != ps.end) {
		*why = "data after the request";
		request_free(r);
		return -1;
	}
	return 0;
bad:
	*why = ps.err ? ps.err : "bad request";
	request_free(r);
	return -1;
}

// ---------------------------------------------------------------------------
// Starting a process.

// lookpath resolves name like a shell would, with the request's PATH (its
// last PATH= entry; an empty element is the working directory).
static char *lookpath(const char *name, char **env, const char *cwd) {
	if (strchr(name, '/'))
		return strdup(name);
	const char *path = DEFAULT_PATH;
	for (char **e = env; e && *e; e++)
		if (strncmp(*e, "PATH=", 5) == 0)
			path = *e + 5;
	const char *p = path;
	while (1) {
		const char *colon = strchr(p, ':');
		size_t dl = colon ? (size_t)(colon - p) : strlen(p);
		struct buf full = {0};
		if (dl == 0) {
			if (cwd && *cwd) {
				buf_put(&full, cwd, strlen(cwd));
				buf_put(&full, "/", 1);
			}
		} else {
			buf_put(&full, p, dl);
			buf_put(&full, "/", 1);
		}
		buf_put(&full, name, strlen(name));
		struct stat st;
		if (stat(full.b, &st) == 0 && !S_ISDIR(st.st_mode) && (st.st_mode & 0111))
			return full.b;
		free(full.b);
		if (!colon)
			return NULL;
		p = colon + 1;
	}
}

struct started {
	pid_t pid;
	int pidfd; // -1 when the kernel gave none
};

// child_setup is what the child does between the fork and execve: an empty
// signal mask (its dispositions are the init's, all at their defaults:
// unignore_signals), a new session, stdio as its 0, 1, 2, the working
// directory, then execve. Only system calls (it may share the init's
// memory: spawn_vm). It returns the errno that stopped it; it does not
// return once execve succeeds.
static int child_setup(const int stdio[3], const char *path, char **argv, char **envv, const char *cwd) {
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	int e = 0;
	int hi[3];
	for (int i = 0; i < 3; i++) // above 0-2 first: the handed fds may be 0-2 themselves
		if ((hi[i] = fcntl(stdio[i], F_DUPFD_CLOEXEC, 10)) < 0)
			e = errno;
	if (!e && setsid() < 0)
		e = errno;
	for (int i = 0; i < 3 && !e; i++)
		if (dup2(hi[i], i) < 0)
			e = errno;
	if (!e && cwd && *cwd && chdir(cwd) < 0)
		e = errno;
	if (!e) {
		execve(path, argv, envv);
		e = errno;
	}
	return e;
}

struct spawn_args {
	const int *stdio;
	const char *path;
	char **argv, **envv;
	const char *cwd;
	volatile int err; // set by a child that failed before or at execve
};

static int spawn_child(void *p) {
	struct spawn_args *a = p;
	a->err = child_setup(a->stdio, a->path, a->argv, a->envv, a->cwd);
	_exit(127);
}

// spawn_vm starts the child as posix_spawn does: in the init's memory
// (CLONE_VM) on a stack of its own, the init suspended until the child's
// execve or exit (CLONE_VFORK). No copy of the init's page tables, no
// copy-on-write faults after it, no TLB shootdown: about a tenth of a
// millisecond of CPU per command against fork. The init is one thread and
// suspended meanwhile, so one static stack serves every child. The child's
// failure comes back in a->err. Returns clone's result (-1 with errno).
static long spawn_vm(struct spawn_args *a, int *pidfd) {
	static char stack[32 * 1024] __attribute__((aligned(16)));
	a->err = 0;
	return clone(spawn_child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, a, pidfd);
}

// start forks req's process in a new session with stdio as its 0, 1, 2.
// On failure it returns -1 with the message in err.
static int start(struct request *req, const int stdio[3], struct started *out, struct buf *err) {
	const char *name = req->args.v[0];
	if (req->args.nul || req->env.nul || req->cwd_nul) {
		buf_printf(err, "start %s: invalid argument", name);
		return -1;
	}
	char *path = lookpath(name, req->env.v, req->cwd);
	if (!path) {
		buf_printf(err, "%s: executable file not found in $PATH", name);
		return -1;
	}
	char tmp[128];
	char *empty_env[] = {NULL};
	char **envv = req->env.v ? req->env.v : empty_env;
	int pidfd = -1;
	struct spawn_args sa = {.stdio = stdio, .path = path, .argv = req->args.v, .envv = envv, .cwd = req->cwd};
	long pid = spawn_vm(&sa, &pidfd);
	if (pid > 0) {
		int e = sa.err;
		if (e) { // the child exits at once; it is reaped like any other
			if (pidfd >= 0)
				close(pidfd);
			buf_printf(err, "start %s: %s", name, errstr(e, tmp, sizeof tmp));
			free(path);
			return -1;
		}
		free(path);
		out->pid = (pid_t)pid;
		out->pidfd = pidfd;
		return 0;
	}
	// A kernel without CLONE_PIDFD (before 5.2), or a filter that refuses
	// CLONE_VM | CLONE_VFORK: fork, and learn of the execve through a
	// close-on-exec pipe.
	int pipefd[2];
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		buf_printf(err, "start %s: %s", name, errstr(errno, tmp, sizeof tmp));
		free(path);
		return -1;
	}
	pidfd = -1;
	pid = syscall(SYS_clone, (unsigned long)(CLONE_PIDFD | SIGCHLD), 0, &pidfd, 0, 0);
	if (pid < 0 && (errno == EINVAL || errno == ENOSYS)) { // a kernel without CLONE_PIDFD
		pidfd = -1;
		pid = fork();
	}
	if (pid == 0) {
		// The child: only system calls from here to execve.
		int e = child_setup(stdio, path, req->args.v, envv, req->cwd);
		(void)!write(pipefd[1], &e, sizeof e);
		_exit(127);
	}
	int e = pid < 0 ? errno : 0;
	close(pipefd[1]);
	if (pid > 0) {
		int ce;
		ssize_t n;
		while ((n = read(pipefd[0], &ce, sizeof ce)) < 0 && errno == EINTR) {
		}
		if (n == (ssize_t)sizeof ce) {
			e = ce;
			// The child exits at once; it is reaped like any other.
			if (pidfd >= 0)
				close(pidfd);
			pid = -1;
		}
	}
	close(pipefd[0]);
	free(path);
	if (pid < 0) {
		buf_printf(err, "start %s: %s", name, errstr(e, tmp, sizeof tmp));
		return -1;
	}
	out->pid = (pid_t)pid;
	out->pidfd = pidfd;
	return 0;
}

// ---------------------------------------------------------------------------
// The exec server.

// A connection waits for its request (pid 0, answered 0), then for its
// process's exit (pid), then, answered, for the daemon to hang up: closing
// right after the last reply loses that reply now and then (measured: one
// in some thousands on this kernel, the reader sees EOF), so the daemon,
// which hangs up once it has read it, closes first, and the init closes
// its end on the EOF or after LINGER_MS.
struct conn {
	int fd;
	pid_t pid;
	int64_t answered; // when the last reply went (ms, monotonic), or 0
};

#define LINGER_MS 10000

static struct conn *conns;
static size_t nconns;

static void conn_add(int fd) {
	conns = xrealloc(conns, (nconns + 1) * sizeof *conns);
	conns[nconns++] = (struct conn){fd, 0, 0};
}

static void conn_drop(size_t i) {
	close(conns[i].fd);
	conns[i] = conns[--nconns];
}

// answered marks conn i's last reply sent: it is closed when the daemon
// hangs up (or after LINGER_MS).
static void answered(size_t i) {
	conns[i].pid = 0;
	conns[i].answered = now_ms();
}

// close_lingering closes the answered connections older than LINGER_MS,
// and returns the poll timeout until the next one is (-1: none).
static int close_lingering(void) {
	int64_t now = now_ms(), next = -1;
	for (size_t i = 0; i < nconns;) {
		if (conns[i].answered && now - conns[i].answered >= LINGER_MS) {
			conn_drop(i);
			continue;
		}
		if (conns[i].answered && (next < 0 || conns[i].answered + LINGER_MS - now < next))
			next = conns[i].answered + LINGER_MS - now;
		i++;
	}
	return next < 0 ? -1 : (int)next + 1;
}

static void json_str(struct buf *b, const char *s) {
	buf_put(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\') {
			buf_put(b, "\\", 1);
			buf_put(b, (const char *)p, 1);
		} else if (*p < 0x20) {
			buf_printf(b, "\\u%04x", *p);
		} else {
			buf_put(b, (const char *)p, 1);
		}
	}
	buf_put(b, "\"", 1);
}

// send_reply sends one reply; it returns -1 when it could not (the daemon
// hung up: EPIPE, MSG_NOSIGNAL).
static int send_reply(int fd, const char *json, int passfd) {
	struct iovec iov = {(void *)json, strlen(json)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	if (passfd >= 0) {
		memset(&u, 0, sizeof u);
		m.msg_control = u.b;
		m.msg_controllen = sizeof u.b;
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &passfd, sizeof(int));
	}
	ssize_t r;
	while ((r = sendmsg(fd, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
	}
	return r < 0 ? -1 : 0;
}

static void send_error(int fd, const char *msg) {
	struct buf b = {0};
	buf_put(&b, "{\"error\":", 9);
	// The daemon reads replies into 4 KiB.
	char cut[1024];
	snprintf(cut, sizeof cut, "%s", msg);
	json_str(&b, cut);
	buf_put(&b, "}", 1);
	send_reply(fd, b.b, -1);
	free(b.b);
}

// serve_request reads conn i's request and starts its process. It returns
// 0 when the connection is to be closed now (the daemon hung up), 1 when
// it waits (for the request, or the process's exit), 2 when it was
// answered (a refusal).
static int serve_request(size_t i) {
	int fd = conns[i].fd;
	// One request at a time (one thread): one buffer, a byte over the
	// limit so an oversized record shows. Its pages cost an idle session
	// only once a request touched them, and a big one gives them back.
	static char data[MAX_REQUEST + 4096] __attribute__((aligned(4096)));
	union {
		char b[CMSG_SPACE(3 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {data, sizeof data};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
	ssize_t n;
	while ((n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT)) < 0 && errno == EINTR) {
	}
	if (n < 0 && errno == EAGAIN)
		return 1; // not here yet
	ssize_t size = (m.msg_flags & MSG_TRUNC) ? (ssize_t)sizeof data : n;
	int fds[3], nfds = 0, extra = 0;
	if (n >= 0) {
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t j = 0; j < k; j++) {
				int got;
				memcpy(&got, CMSG_DATA(c) + j * sizeof(int), sizeof(int));
				if (nfds < 3)
					fds[nfds++] = got;
				else
					close(got), extra++;
			}
		}
		if (m.msg_flags & MSG_CTRUNC)
			extra++;
	}
	int keep = 2;
	struct buf err = {0};
	struct request req;
	const char *why;
	if (n <= 0) {
		keep = 0;
	} else if (nfds != 3 || extra) {
		buf_printf(&err, "want 3 stdio fds, got %d", nfds + extra);
		send_error(fd, err.b);
	} else if ((size_t)size > MAX_REQUEST) {
		buf_printf(&err, "bad request: more than %d bytes", MAX_REQUEST);
		send_error(fd, err.b);
	} else if (parse_request(data, (size_t)n, &req, &why) < 0) {
		buf_printf(&err, "bad request: %s", why);
		send_error(fd, err.b);
	} else if (req.args.n == 0) {
		send_error(fd, "bad request: no args");
		request_free(&req);
	} else {
		struct started st;
		if (start(&req, fds, &st, &err) < 0) {
			send_error(fd, err.b);
		} else {
			char reply[64];
			snprintf(reply, sizeof reply, "{\"pid\":%d}", (int)st.pid);
			if (send_reply(fd, reply, st.pidfd) < 0 && (errno == EPIPE || errno == ECONNRESET)) {
				// The daemon gave up on the start (it hung up): nobody
				// would watch or end this process, so it is ended now
				// (reaped, and its connection closed, as any). Only
				// then: a reply that failed otherwise (the socket is
				// non-blocking) says nothing of the daemon.
				kill(-st.pid, SIGKILL);
			}
			if (st.pidfd >= 0)
				close(st.pidfd);
			conns[i].pid = st.pid;
			keep = 1;
		}
		request_free(&req);
	}
	for (int j = 0; j < nfds; j++)
		close(fds[j]);
	free(err.b);
	if (n > 64 << 10)
		madvise(data, sizeof data, MADV_DONTNEED);
	return keep;
}

// reap collects every exited child and answers its connection; it reports
// whether no children are left.
static int reap(void) {
	while (1) {
		int ws;
		pid_t pid = waitpid(-1, &ws, WNOHANG);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid < 0 && errno == ECHILD)
			return 1;
		if (pid <= 0)
			return 0;
		int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? -WTERMSIG(ws) : -1;
		for (size_t i = 0; i < nconns; i++) {
			if (conns[i].pid == pid) {
				char reply[64];
				snprintf(reply, sizeof reply, "{\"exit\":%d}", code);
				send_reply(conns[i].fd, reply, -1);
				answered(i);
				break;
			}
		}
	}
}

// others_alive reports whether a process other than this one runs (zombies
// aside) in the session's pid namespace.
static int others_alive(void) {
	DIR *d = opendir("/proc");
	if (!d)
		return 0;
	int alive = 0;
	struct dirent *e;
	while (!alive && (e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || end == e->d_name || pid == getpid())
			continue;
		char path[64], st[512];
		snprintf(path, sizeof path, "/proc/%ld/stat", pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue; // exited meanwhile
		ssize_t n = read(fd, st, sizeof st - 1);
		close(fd);
		if (n <= 0)
			continue;
		st[n] = 0;
		// The state follows the parenthesised command name, which may hold spaces.
		char *rp = strrchr(st, ')');
		if (rp && rp + 2 < st + n && rp[2] != 'Z')
			alive = 1;
	}
	closedir(d);
	return alive;
}

// unignore_signals sets every signal the init was started with ignored back
// to its default. SIG_IGN survives execve, from whatever started the
// sandbox's daemon: left alone, every command would inherit it (^C, a trap
// on INT or a hangup would do nothing in the session), and an ignored
// SIGCHLD would have the kernel reap the init's children before it learns
// their exit codes. The init itself sets no handler (its signals come
// through signalfd), so its commands start with every signal at its
// default, as posix_spawn's POSIX_SPAWN_SETSIGDEF and systemd give them. The
// signals the C library reserves for itself cannot be set and stay as they
// are.
static void unignore_signals(void) {
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction old;
		if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN)
			sigaction(sig, &dfl, NULL);
	}
}

static void terminate_all(void) {
	kill(-1, SIGTERM);
	int64_t deadline = now_ms() + SHUTDOWN_GRACE_MS;
	while (now_ms() < deadline) {
		reap();
		if (!others_alive())
			return;
		sleep_ms(10);
	}
	kill(-1, SIGKILL);
	while (!reap())
		sleep_ms(5);
}

int main(int argc, char **argv) {
	if (getpid() != 1) {
		fprintf(stderr, "sessinit: refusing to run: not PID 1 of a session's pid namespace\n");
		return 2;
	}
	unignore_signals();
	// The signals arrive on a descriptor; SIGPIPE stays blocked (a write to
	// a daemon that hung up must not end the session). Children get an
	// empty mask back before they exec.
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGCHLD);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGPIPE);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	sigdelset(&mask, SIGPIPE);

	// Before anything else: nothing of the session runs unfiltered.
	char why[512];
	if (load_filter(why, sizeof why) < 0) {
		report_ready(why);
		fprintf(stderr, "sessinit: %s\n", why);
		return 1;
	}
	report_ready(NULL);

	int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		fprintf(stderr, "sessinit: signalfd: %s\n", strerror(errno));
		return 1;
	}

	int lfd = -1;
	if (getenv("EOS_EXEC_FD")) {
		lfd = envfd("EOS_EXEC_FD", 0);
		int type = 0;
		socklen_t tl = sizeof type;
		if (lfd < 0 || getsockopt(lfd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_SEQPACKET) {
			fprintf(stderr, "sessinit: exec socket: EOS_EXEC_FD is not a seqpacket socket\n");
			lfd = -1;
		} else {
			fcntl(lfd, F_SETFD, FD_CLOEXEC);
			fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
		}
	}

	if (argc > 1) { // a first child, with this process's stdio
		struct request req = {0};
		req.args.v = xrealloc(NULL, (size_t)argc * sizeof(char *));
		for (int i = 1; i < argc; i++)
			req.args.v[req.args.n++] = strdup(argv[i]);
		req.args.v[req.args.n] = NULL;
		size_t ne = 0;
		while (environ[ne])
			ne++;
		req.env.v = xrealloc(NULL, (ne + 1) * sizeof(char *));
		for (size_t i = 0; i < ne; i++)
			req.env.v[req.env.n++] = strdup(environ[i]);
		req.env.v[req.env.n] = NULL;
		req.cwd = strdup("/");
		int stdio[3] = {0, 1, 2};
		struct started st;
		struct buf err = {0};
		if (start(&req, stdio, &st, &err) < 0)
			fprintf(stderr, "sessinit: %s\n", err.b);
		else if (st.pidfd >= 0)
			close(st.pidfd);
		free(err.b);
		request_free(&req);
	}

	struct pollfd *pfds = NULL;
	while (1) {
		size_t np = 0;
		pfds = xrealloc(pfds, (nconns + 2) * sizeof *pfds);
		pfds[np++] = (struct pollfd){sfd, POLLIN, 0};
		if (lfd >= 0)
			pfds[np++] = (struct pollfd){lfd, POLLIN, 0};
		size_t first = np;
		for (size_t i = 0; i < nconns; i++) // waiting for a request, or answered (for the hang-up)
			pfds[np++] = (struct pollfd){conns[i].pid ? -1 : conns[i].fd, POLLIN, 0};
		// No other timer: an idle session sleeps until a signal or a
		// connection (SIGCHLD is never lost, only coalesced, and reap
		// takes them all).
		int r = poll(pfds, np, close_lingering());
		if (r < 0 && errno != EINTR) {
			sleep_ms(10);
			continue;
		}
		struct signalfd_siginfo si;
		int stop = 0;
		while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
			if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
				stop = 1;
		reap();
		if (stop) {
			terminate_all();
			return 0;
		}
		// Walk the connections polled (by fd: reap may have reordered them).
		for (size_t k = first; r > 0 && k < np; k++) {
			if (pfds[k].fd < 0 || !pfds[k].revents)
				continue;
			for (size_t i = 0; i < nconns; i++) {
				if (conns[i].fd != pfds[k].fd || conns[i].pid != 0)
					continue;
				int rc = conns[i].answered ? 0 : serve_request(i); // answered and readable: the daemon hung up
				if (rc == 0)
					conn_drop(i);
				else if (rc == 2)
					answered(i);
				break;
			}
		}
		if (lfd >= 0 && r > 0 && (pfds[1].revents & POLLIN)) {
			for (int k = 0; k < 64; k++) {
				int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
				if (c < 0)
					break;
				conn_add(c);
			}
		}
	}
}
