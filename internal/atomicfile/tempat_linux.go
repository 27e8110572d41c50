package atomicfile

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// CreateTempAt creates a new file, open for writing, in the directory dfd
// under prefix plus 16 random characters, with mode perm less the umask,
// never through a symlink. A name that exists (another writer's, or one a
// stranger made to get in the way) is skipped, never opened or removed.
// It returns the file and its name in dfd; the caller removes it.
func CreateTempAt(dfd int, prefix string, perm fs.FileMode) (*os.File, string, error) {
	if len(prefix) > 200 { // the whole must fit in NAME_MAX (255)
		prefix = prefix[:200]
	}
	for range 16 {
		name := prefix + rand.Text()[:16]
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		return os.NewFile(uintptr(fd), name), name, nil
	}
	return nil, "", fmt.Errorf("create a temporary file %s...: every name tried exists", prefix)
}
