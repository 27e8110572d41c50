// Package imageref checks image references. It is apart from package api
// because github.com/distribution/reference compiles its grammar's regular
// expressions when the program starts (1.2 ms, with go-digest's 0.26 ms):
// the daemon links package api, and its binary is re-executed as runc init
// for every session start, which would pay that each time.
package imageref

import (
	"github.com/distribution/reference"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// maxImageRef bounds an image reference (a name, tag and digest are far
// shorter; Docker's own name limit is 255).
const maxImageRef = 512

// Check refuses what cannot name a local image: empty, oversized, or
// not a Docker reference (name[:tag][@digest]) nor an image id. Nothing is
// ever pulled, so this only decides whether asking the Engine makes sense:
// an invalid reference is the caller's error, answered at once, not a
// Docker failure to retry.
func Check(image string) error {
	details := map[string]any{"arg": "image"}
	switch {
	case image == "":
		return api.Errorf(api.KindInvalidRequest, details, "image is required")
	case len(image) > maxImageRef:
		return api.Errorf(api.KindInvalidRequest, details, "image reference is longer than %d bytes", maxImageRef)
	}
	if _, err := reference.ParseAnyReference(image); err != nil {
		return api.Errorf(api.KindInvalidRequest, details, "image %q is not a valid image reference: %v", image, err)
	}
	return nil
}
