package layerstack

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// MaxPathBytes bounds a workspace path; Linux's PATH_MAX.
const MaxPathBytes = 4096

// MaxPublishPathBytes bounds a path a publish writes: a layer is built
// under the store's directories, whose names come first and must leave
// the whole within PATH_MAX.
const MaxPublishPathBytes = MaxPathBytes - 512

// protectedTop are store-internal names that may not be published at the
// workspace root. They are the seed's names, kept so a change set that the seed
// refused is refused here too.
var protectedTop = map[string]bool{
	"manifest.json":   true,
	"workspace.json":  true,
	"layers":          true,
	"staging":         true,
	".layer-metadata": true,
}

// Path rejection reasons (stable, snake_case, part of the wire contract).
const (
	ReasonInvalidPath   = "invalid_layer_path"
	ReasonProtectedPath = "protected_path"
)

// PathError says why a workspace path was refused.
type PathError struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
	Detail string `json:"message"`
}

func (e *PathError) Error() string {
	return fmt.Sprintf("%s %q: %s", e.Reason, e.Path, e.Detail)
}

// ErrInvalidPath matches every *PathError with errors.Is.
var ErrInvalidPath = errors.New("invalid workspace path")

func (e *PathError) Is(target error) bool { return target == ErrInvalidPath }

// CleanPath validates a workspace-relative path and returns its canonical
// slash-separated form ("" is the workspace root). A leading "/" is accepted
// and means the workspace root; any ".." that would climb above the root, NUL
// bytes, invalid UTF-8 and over-long paths are refused.
func CleanPath(p string) (string, error) {
	bad := func(detail string) (string, error) {
		return "", &PathError{Path: p, Reason: ReasonInvalidPath, Detail: detail}
	}
	if len(p) > MaxPathBytes {
		return bad("path too long")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return bad("path contains a NUL byte")
	}
	if !utf8.ValidString(p) {
		return bad("path is not valid UTF-8")
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return bad("path climbs out of the workspace")
		}
		if len(c) > 255 {
			return bad("path component longer than 255 bytes")
		}
	}
	c := path.Clean("/" + p)
	return strings.TrimPrefix(c, "/"), nil
}

// CheckPublishable refuses a clean path that names store internals or the
// overlay whiteout namespace. Lookalikes such as ".wh" or "x.wh.y" pass.
func CheckPublishable(p string) error {
	if p == "" {
		return &PathError{Path: p, Reason: ReasonInvalidPath, Detail: "the workspace root itself cannot be changed"}
	}
	if len(p) > MaxPublishPathBytes {
		return &PathError{Path: p, Reason: ReasonInvalidPath,
			Detail: fmt.Sprintf("path of %d bytes is longer than a layer can hold (%d): the layer's own directory comes before it, within Linux's PATH_MAX", len(p), MaxPublishPathBytes)}
	}
	parts := strings.Split(p, "/")
	if protectedTop[parts[0]] {
		return &PathError{Path: p, Reason: ReasonProtectedPath, Detail: "store-internal name at the workspace root"}
	}
	for _, c := range parts {
		if c == ".layer-metadata" {
			return &PathError{Path: p, Reason: ReasonProtectedPath, Detail: "store-internal name"}
		}
		if strings.HasPrefix(c, ".wh.") {
			return &PathError{Path: p, Reason: ReasonProtectedPath, Detail: "name in the overlay whiteout namespace (.wh.)"}
		}
	}
	return nil
}

// ancestors returns the proper ancestors of a clean path, shallowest first.
func ancestors(p string) []string {
	var out []string
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			out = append(out, p[:i])
		}
	}
	return out
}

// nearPath reports whether p is one of paths, a directory above one of
// them (above: their ancestors), or inside one of covers.
func nearPath(p string, paths, above, covers map[string]bool) bool {
	if paths[p] || above[p] {
		return true
	}
	for _, a := range ancestors(p) {
		if covers[a] {
			return true
		}
	}
	return false
}

// isUnder reports whether p is strictly inside dir ("" is the root).
func isUnder(p, dir string) bool {
	if dir == "" {
		return p != ""
	}
	return len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}
