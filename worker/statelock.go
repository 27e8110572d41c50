package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// stateLockName is the file in a state dir whose exclusive lock the
// embedded Temporal server holds while it runs: its SQLite database must
// have one server, and two gateways on one state dir (one started with
// another --temporal-embedded-address and --listen) would each take the
// history shards from the other.
const stateLockName = "temporal.lock"

// lockStateDir takes dir's lock, or says which process holds it. The
// kernel drops the lock when the process dies, so a crash leaves nothing
// to clean up; unlock releases it.
func lockStateDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, stateLockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				holder = "process " + strconv.Itoa(pid)
			}
			return nil, fmt.Errorf("state dir %s is in use by %s (its embedded Temporal): stop that gateway or worker first, or give this one its own --state-dir", dir, holder)
		}
		return nil, fmt.Errorf("state dir lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
