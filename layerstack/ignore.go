package layerstack

import (
	"strings"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
)

// ignoreOracle answers "is this path gitignored?" against one fixed view
// (the publishing session's base, so the answer cannot change under it). It
// reads only the .gitignore files on the paths asked about, plus
// .git/info/exclude, and caches them per directory.
type ignoreOracle struct {
	st       stack
	patterns map[string][]gitignore.Pattern
}

func newIgnoreOracle(st stack) *ignoreOracle {
	return &ignoreOracle{st: st, patterns: map[string][]gitignore.Pattern{}}
}

func (o *ignoreOracle) load(dir string) []gitignore.Pattern {
	if ps, ok := o.patterns[dir]; ok {
		return ps
	}
	var domain []string
	if dir != "" {
		domain = strings.Split(dir, "/")
	}
	var ps []gitignore.Pattern
	read := func(p string) {
		e, err := lookup(o.st, p)
		if err != nil || e.Kind != KindFile || e.Size > 1<<20 {
			return
		}
		b, err := readFull(e.full)
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimRight(line, "\r")
			if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
				continue
			}
			ps = append(ps, gitignore.ParsePattern(line, domain))
		}
	}
	if dir == "" {
		read(".git/info/exclude")
	}
	read(joinPath(dir, ".gitignore"))
	o.patterns[dir] = ps
	return ps
}

// ignored applies git's rules: the deepest .gitignore wins, later lines win,
// and an ignored directory seals everything below it (no negation can
// re-include a path inside an ignored directory).
func (o *ignoreOracle) ignored(p string, isDir bool) bool {
	parts := strings.Split(p, "/")
	var ps []gitignore.Pattern
	for i := range parts {
		dir := strings.Join(parts[:i], "/")
		ps = append(ps, o.load(dir)...)
		if len(ps) == 0 {
			continue
		}
		last := i == len(parts)-1
		if gitignore.NewMatcher(ps).Match(parts[:i+1], !last || isDir) {
			return true
		}
	}
	return false
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}
