package activities

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// maxListedDirectories caps one list_workspace_directories answer.
const maxListedDirectories = 500

// ListDirectories lists the directories under an absolute path of this
// host, for choosing a workspace root; "" lists the allowed roots. It reads
// names only, never contents, and only of a path a workspace_root may be
// (the host path policy, checked here as if a stranger sent it): neither
// the state dir nor a system directory nor anything outside the allowed
// roots is listed, nor shown as a parent or an entry.
func (a *Activities) ListDirectories(ctx context.Context, p string) (workflows.DirectoryListing, error) {
	if p == "" {
		// The allowed roots: the only places a workspace_root may be.
		out := workflows.DirectoryListing{Directories: []workflows.DirectoryEntry{}}
		for _, r := range a.cfg.HostPaths.Roots() {
			out.Directories = append(out.Directories, workflows.DirectoryEntry{Name: filepath.Base(r), Path: r})
		}
		return out, nil
	}
	clean, err := a.cfg.HostPaths.Browse("path", p)
	if err != nil {
		return workflows.DirectoryListing{}, hostPathError(err)
	}
	d, err := hostpath.OpenDir("path", clean, false) // the directory checked, not a symlink put there since
	if err != nil {
		return workflows.DirectoryListing{}, hostPathError(err)
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return workflows.DirectoryListing{}, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "path"}, "cannot list %s: %v", clean, err)
	}
	slices.SortFunc(ents, func(x, y os.DirEntry) int { return strings.Compare(x.Name(), y.Name()) })
	out := workflows.DirectoryListing{Path: clean, Directories: []workflows.DirectoryEntry{}}
	if parent := filepath.Dir(clean); a.listable(parent) {
		out.Parent = &parent
	}
	for _, e := range ents {
		if !e.IsDir() { // symlinks included: never followed
			continue
		}
		child := filepath.Join(clean, e.Name())
		if !a.listable(child) {
			continue
		}
		if len(out.Directories) == maxListedDirectories {
			out.Truncated = true
			break
		}
		out.Directories = append(out.Directories, workflows.DirectoryEntry{Name: e.Name(), Path: child})
	}
	return out, nil
}

// listable: p may be listed (the host path policy's Browse).
func (a *Activities) listable(p string) bool {
	_, err := a.cfg.HostPaths.Browse("path", p)
	return err == nil
}

// LocalDaemon is where the daemon of a sandbox of this host and this
// deployment listens on this host (the forwarder's lookup). A sandbox
// whose container is not here, not ours or not running is refused. (A
// function, not a method: every exported method is an activity.)
func LocalDaemon(ctx context.Context, a *Activities, sandboxID string) (api.Endpoint, error) {
	if err := checkSandboxID(sandboxID); err != nil {
		return api.Endpoint{}, refusalOf(err)
	}
	c, err := a.inspectContainer(ctx, sandboxID)
	if err != nil {
		if e, ok := apperr.From(err); ok {
			return api.Endpoint{}, api.Errorf(api.KindNotFound, map[string]any{"sandbox_id": sandboxID}, "%s", e.Message)
		}
		return api.Endpoint{}, err
	}
	l := labelsOf(c)
	if !isOurs(l, sandboxID) || !a.sameOwner(l) {
		return api.Endpoint{}, api.Errorf(api.KindNotFound, map[string]any{"sandbox_id": sandboxID}, "sandbox %s is not one of this host's", sandboxID)
	}
	if c.State == nil || !c.State.Running {
		return api.Endpoint{}, api.Errorf(api.KindOperationFailed, map[string]any{"sandbox_id": sandboxID, "availability": "unavailable"},
			"the container of sandbox %s is %s", sandboxID, stateString(c))
	}
	return daemonEndpoint(c), nil
}

// CountSandboxes is the number of this deployment's sandbox containers on
// this host (the load a host's heartbeat reports every few seconds: one
// container list, no volume sizes).
func CountSandboxes(ctx context.Context, a *Activities) (int, error) {
	cs, err := a.docker.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelManaged+"=true"), filters.Arg("label", LabelRole+"="+roleSandbox))})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cs {
		if c.Labels[LabelSandboxID] != "" && a.sameOwner(c.Labels) {
			n++
		}
	}
	return n, nil
}

func refusalOf(err error) error {
	if e, ok := apperr.From(err); ok {
		return e
	}
	return err
}
