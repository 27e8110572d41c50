package runtime

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// capability is a Linux capability by number and Docker's name for it.
type capability struct {
	bit  uint
	name string
	why  string
}

// requiredCaps are what the daemon needs to create sessions; the names are
// Docker's --cap-add spellings.
var requiredCaps = []capability{
	{unix.CAP_SYS_ADMIN, "SYS_ADMIN", "mounts, namespaces, pivot_root, cgroup remount"},
	{unix.CAP_DAC_OVERRIDE, "DAC_OVERRIDE", "the root overlay mount fails with EACCES without it"},
	{unix.CAP_SYS_CHROOT, "SYS_CHROOT", "joining a session's mount namespace (setns)"},
	{unix.CAP_SETUID, "SETUID", "setgroups/setuid in runc init"},
	{unix.CAP_SETGID, "SETGID", "setgroups/setgid in runc init"},
	{unix.CAP_SETPCAP, "SETPCAP", "without it the session's bounding set is silently not reduced"},
}

// sessionCapBits are the capabilities sessions keep; the daemon must hold
// them to hand them on.
var sessionCapBits = []capability{
	{unix.CAP_CHOWN, "CHOWN", ""}, {unix.CAP_DAC_OVERRIDE, "DAC_OVERRIDE", ""},
	{unix.CAP_FOWNER, "FOWNER", ""}, {unix.CAP_FSETID, "FSETID", ""}, {unix.CAP_KILL, "KILL", ""},
	{unix.CAP_SETGID, "SETGID", ""}, {unix.CAP_SETUID, "SETUID", ""}, {unix.CAP_SETPCAP, "SETPCAP", ""},
	{unix.CAP_NET_BIND_SERVICE, "NET_BIND_SERVICE", ""}, {unix.CAP_NET_RAW, "NET_RAW", ""},
	{unix.CAP_SYS_CHROOT, "SYS_CHROOT", ""}, {unix.CAP_MKNOD, "MKNOD", ""},
	{unix.CAP_AUDIT_WRITE, "AUDIT_WRITE", ""}, {unix.CAP_SETFCAP, "SETFCAP", ""},
}

// effectiveCaps reads the calling process's effective capability mask.
func effectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read /proc/self/status: %w", err)
	}
	return parseCapEff(string(b))
}

func parseCapEff(status string) (uint64, error) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff line in /proc/self/status")
}

// missingCaps lists the capabilities of want not in mask, as "NAME (why)".
func missingCaps(mask uint64, want []capability) []string {
	var out []string
	for _, c := range want {
		if mask&(1<<c.bit) == 0 {
			s := c.name
			if c.why != "" {
				s += " (" + c.why + ")"
			}
			out = append(out, s)
		}
	}
	return out
}

// checkCaps returns an error naming every missing capability, and whether
// NET_ADMIN (needed only for isolated sessions) is present.
func checkCaps() (netAdmin bool, err error) {
	mask, err := effectiveCaps()
	if err != nil {
		return false, err
	}
	missing := missingCaps(mask, requiredCaps)
	for _, m := range missingCaps(mask, sessionCapBits) {
		if !containsPrefix(missing, m) {
			missing = append(missing, m+" (sessions keep it)")
		}
	}
	if len(missing) > 0 {
		return false, fmt.Errorf("%w: missing capabilities %s; create the sandbox with --cap-drop ALL and one --cap-add per capability",
			ErrUnsupported, strings.Join(missing, ", "))
	}
	return mask&(1<<unix.CAP_NET_ADMIN) != 0, nil
}

func containsPrefix(list []string, name string) bool {
	for _, s := range list {
		if s == name || strings.HasPrefix(s, name+" ") {
			return true
		}
	}
	return false
}
