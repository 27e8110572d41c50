package api

import (
	"github.com/distribution/reference"
)

// maxImageRef bounds an image reference (a name, tag and digest are far
// shorter; Docker's own name limit is 255).
const maxImageRef = 512

// CheckImageRef refuses what cannot name a local image: empty, oversized, or
// not a Docker reference (name[:tag][@digest]) nor an image id. Nothing is
// ever pulled, so this only decides whether asking the Engine makes sense:
// an invalid reference is the caller's error, answered at once, not a
// Docker failure to retry.
func CheckImageRef(image string) error {
	details := map[string]any{"arg": "image"}
	switch {
	case image == "":
		return Errorf(KindInvalidRequest, details, "image is required")
	case len(image) > maxImageRef:
		return Errorf(KindInvalidRequest, details, "image reference is longer than %d bytes", maxImageRef)
	}
	if _, err := reference.ParseAnyReference(image); err != nil {
		return Errorf(KindInvalidRequest, details, "image %q is not a valid image reference: %v", image, err)
	}
	return nil
}
