package activities

import (
	"context"
	"os"
	"path/filepath"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

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
