package hostpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// Rules a refused path broke (Error.Rule).
const (
	RuleAbsolute  = "absolute"      // not an absolute path, or a "." or ".." component
	RuleSymlink   = "no_symlink"    // a component is a symlink
	RuleSystem    = "system_dir"    // "/", or at or below /etc, /proc, /sys, /dev, /boot
	RuleProtected = "protected_dir" // at, below or above a protected directory
	RuleRoots     = "allowed_roots" // outside every allowed root
	RuleKind      = "kind"          // not a directory (a workspace) or not a regular file/absent (a file)
	RuleMissing   = "missing"       // a workspace that does not exist
)

// systemDirs may never be named, nor anything below them.
var systemDirs = []string{"/etc", "/proc", "/sys", "/dev", "/boot"}

// Error is a refused path.
type Error struct {
	Arg  string // the argument that carried it (workspace_root, dest)
	Path string
	Rule string
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("%s %q: %s", e.Arg, e.Path, e.Msg) }

// Policy holds the allowed roots and the protected directories.
type Policy struct {
	roots     []string
	protected []string
}

// New builds a policy. Roots are resolved (symlinks followed) once here, so
// a root may be given through a link; protected dirs are resolved when they
// exist. A policy without roots refuses every path.
func New(roots []string, protected ...string) (*Policy, error) {
	p := &Policy{}
	for _, r := range roots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("allowed root %q is not an absolute path", r)
		}
		c, err := filepath.EvalSymlinks(r)
		if err != nil {
			return nil, fmt.Errorf("allowed root %q: %w", r, err)
		}
		if c == "/" {
			return nil, errors.New("allowed root \"/\" would allow every path: name the directories that hold workspaces")
		}
		if !slices.Contains(p.roots, c) {
			p.roots = append(p.roots, c)
		}
	}
	for _, d := range protected {
		if d == "" {
			continue
		}
		d = filepath.Clean(d)
		if !filepath.IsAbs(d) {
			a, err := filepath.Abs(d)
			if err != nil {
				return nil, err
			}
			d = a
		}
		if c, err := filepath.EvalSymlinks(d); err == nil {
			d = c
		}
		p.protected = append(p.protected, d)
	}
	return p, nil
}

// DefaultRoots are the invoking user's home and the current directory
// (unless it is "/").
func DefaultRoots() []string {
	var out []string
	if h, err := os.UserHomeDir(); err == nil && h != "" && h != "/" {
		out = append(out, h)
	}
	if wd, err := os.Getwd(); err == nil && wd != "/" {
		out = append(out, wd)
	}
	return out
}

// Roots are the resolved allowed roots.
func (p *Policy) Roots() []string { return slices.Clone(p.roots) }

// Workspace checks a directory to copy from: it must exist and be a
// directory. It returns the cleaned path.
func (p *Policy) Workspace(arg, path string) (string, error) {
	clean, err := p.check(arg, path, false)
	if err != nil {
		return "", err
	}
	return existingDir(arg, path, clean)
}

// Browse checks a directory to list when choosing a workspace: a
// Workspace, or a directory above a protected one (a home that holds the
// state dir is listed, to reach the projects in it; it is not a
// workspace).
func (p *Policy) Browse(arg, path string) (string, error) {
	clean, err := p.check(arg, path, true)
	if err != nil {
		return "", err
	}
	return existingDir(arg, path, clean)
}

func existingDir(arg, path, clean string) (string, error) {
	fi, err := os.Lstat(clean)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &Error{arg, path, RuleMissing, "does not exist"}
	}
	if err != nil {
		return "", &Error{arg, path, RuleMissing, err.Error()}
	}
	if !fi.IsDir() {
		return "", &Error{arg, path, RuleKind, "is not a directory"}
	}
	return clean, nil
}

// Dest checks a destination: a directory to apply changes to, or a file to
// create. It may not exist yet; what exists of it must be a directory
// (dir) or absent (a file destination refuses to overwrite separately).
func (p *Policy) Dest(arg, path string, dir bool) (string, error) {
	clean, err := p.check(arg, path, false)
	if err != nil {
		return "", err
	}
	if fi, err := os.Lstat(clean); err == nil && dir && !fi.IsDir() {
		return "", &Error{arg, path, RuleKind, "exists and is not a directory"}
	}
	return clean, nil
}

// check applies the rules to path; above lets it be above a protected
// directory (not at or below one).
func (p *Policy) check(arg, path string, above bool) (string, error) {
	if !filepath.IsAbs(path) {
		return "", &Error{arg, path, RuleAbsolute, "must be an absolute host path"}
	}
	for part := range strings.SplitSeq(path, "/") {
		if part == "." || part == ".." {
			return "", &Error{arg, path, RuleAbsolute, "must not contain . or .. components"}
		}
	}
	clean := filepath.Clean(path)
	if clean == "/" {
		return "", &Error{arg, path, RuleSystem, "is the root directory"}
	}
	for _, d := range systemDirs {
		if within(clean, d) {
			return "", &Error{arg, path, RuleSystem, "is at or below the system directory " + d}
		}
	}
	if err := noSymlink(arg, path, clean); err != nil {
		return "", err
	}
	for _, d := range p.protected {
		if within(clean, d) || (!above && within(d, clean)) {
			return "", &Error{arg, path, RuleProtected, "is at, below or above the protected directory " + d + " (the gateway's state)"}
		}
	}
	for _, r := range p.roots {
		if within(clean, r) {
			return clean, nil
		}
	}
	roots := "none configured"
	if len(p.roots) > 0 {
		roots = strings.Join(p.roots, ", ")
	}
	return "", &Error{arg, path, RuleRoots, "is outside the allowed roots (" + roots + "; see --allow-root)"}
}

// noSymlink walks clean from "/" and refuses a component that is a symlink.
// A missing component ends the walk: nothing below it exists.
func noSymlink(arg, path, clean string) error {
	cur := "/"
	for part := range strings.SplitSeq(strings.TrimPrefix(clean, "/"), "/") {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return &Error{arg, path, RuleSymlink, err.Error()}
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return &Error{arg, path, RuleSymlink, "must not contain a symlink (" + cur + " is one); name the real path"}
		}
		if !fi.IsDir() {
			return nil // a file ends the walk; Workspace/Dest judge its kind
		}
	}
	return nil
}

// within reports whether p is d or below it (both clean and absolute).
func within(p, d string) bool {
	return p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/")
}

// Default is the policy of DefaultRoots with nothing protected: what a
// caller that configured none gets. When the roots cannot be resolved it
// refuses every path.
func Default() *Policy {
	if p, err := New(DefaultRoots()); err == nil {
		return p
	}
	return &Policy{}
}

// Refusal is a refused host path as the wire's invalid_request, naming the
// argument, the path and the rule it broke.
func Refusal(err error) *api.Error {
	var he *Error
	if errors.As(err, &he) {
		return api.Errorf(api.KindInvalidRequest, map[string]any{"arg": he.Arg, "path": he.Path, "rule": he.Rule}, "%s", he.Error())
	}
	return api.Errorf(api.KindInvalidRequest, nil, "%v", err)
}
