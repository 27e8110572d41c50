package layerstack

import (
	"io/fs"
	"syscall"
)

// rdevOf returns the device number of a device node, or ^0 when unknown.
func rdevOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Rdev
	}
	return ^uint64(0)
}
