//go:build !(cgo && seccomp)

package runtime

import (
	"fmt"

	"github.com/opencontainers/runc/libcontainer/configs"
)

// compileFilter needs libseccomp; newSessionFilter already refuses such a
// binary, so this is never reached in a daemon that starts sessions.
func compileFilter(*configs.Seccomp) (*compiledFilter, error) {
	return nil, fmt.Errorf("%w: this binary was built without libseccomp", ErrUnsupported)
}
