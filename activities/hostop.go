package activities

import (
	"context"
	"os"
	"path/filepath"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// maxListedDirectories caps one list_workspace_directories answer.
const maxListedDirectories = 500

// ListDirectories lists the directories under an absolute path of this
// host, for choosing a workspace root; "" lists the home directory. It
// reads names only, never contents.
func (a *Activities) ListDirectories(ctx context.Context, p string) (workflows.DirectoryListing, error) {
	if p == "" {
		// The allowed roots: the only places a workspace_root may be.
		out := workflows.DirectoryListing{Directories: []workflows.DirectoryEntry{}}
		for _, r := range a.cfg.HostPaths.Roots() {
			out.Directories = append(out.Directories, workflows.DirectoryEntry{Name: filepath.Base(r), Path: r})
		}
		return out, nil
	}
	if !filepath.IsAbs(p) {
		return workflows.DirectoryListing{}, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "path"}, "path must be absolute")
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return workflows.DirectoryListing{}, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "path"}, "cannot list %s: %v", p, err)
	}
	parent := filepath.Dir(p)
	out := workflows.DirectoryListing{Path: p, Parent: &parent, Directories: []workflows.DirectoryEntry{}}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if len(out.Directories) == maxListedDirectories {
			out.Truncated = true
			break
		}
		out.Directories = append(out.Directories, workflows.DirectoryEntry{Name: e.Name(), Path: filepath.Join(p, e.Name())})
	}
	return out, nil
}
