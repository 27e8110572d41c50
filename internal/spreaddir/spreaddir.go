package spreaddir

import (
	"golang.org/x/sys/unix"
)

const (
	// ext4's magic number, shared by ext2 and ext3.
	ext4SuperMagic = 0xEF53
	// topdirFL is FS_TOPDIR_FL of linux/fs.h (golang.org/x/sys/unix has no
	// name for it).
	topdirFL = 0x00020000
)

// Spread sets FS_TOPDIR_FL on dir when it is on ext2/3/4. It reports
// whether the flag is set when it returns; err says why it is not (nil on
// another file system, which has no such flag).
func Spread(dir string) (bool, error) {
	if ok, err := Supported(dir); !ok || err != nil {
		return false, err
	}
	return withFlags(dir, func(fd int, flags uint32) (bool, error) {
		if flags&topdirFL != 0 {
			return true, nil
		}
		if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|topdirFL)); err != nil {
			return false, err
		}
		return true, nil
	})
}

// Spreads reports whether dir has the flag.
func Spreads(dir string) (bool, error) {
	return withFlags(dir, func(_ int, flags uint32) (bool, error) { return flags&topdirFL != 0, nil })
}

// Supported reports whether the file system of path has the flag (ext2/3/4).
func Supported(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return st.Type == ext4SuperMagic, nil
}

// withFlags runs fn with the directory dir open (never through a symlink)
// and its inode flags.
func withFlags(dir string, fn func(fd int, flags uint32) (bool, error)) (bool, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return false, err
	}
	return fn(fd, flags)
}
