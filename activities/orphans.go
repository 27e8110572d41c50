package activities

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"

	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// withAdoptLabels adds to a sandbox's labels what adopting it later needs:
// its image and workspace root.
func withAdoptLabels(spec workflows.SandboxSpec) map[string]string {
	l := make(map[string]string, len(spec.Labels)+2)
	for k, v := range spec.Labels {
		l[k] = v
	}
	l[LabelImage] = spec.Image
	if spec.WorkspaceRoot != "" {
		l[LabelWorkspaceRoot] = spec.WorkspaceRoot
	}
	return l
}

// ListSandboxObjects lists the sandboxes whose containers or state volumes
// are on this Docker host (labelled as ours and, with a WorkerID, as this
// worker's), with the volume's size and age. It reads only.
func (a *Activities) ListSandboxObjects(ctx context.Context) ([]workflows.SandboxObjects, error) {
	f := filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))
	if a.cfg.WorkerID != "" {
		f.Add("label", LabelWorker+"="+a.cfg.WorkerID)
	}
	by := map[string]*workflows.SandboxObjects{}
	get := func(id string) *workflows.SandboxObjects {
		if o, ok := by[id]; ok {
			return o
		}
		o := &workflows.SandboxObjects{SandboxID: id, VolumeBytes: -1}
		by[id] = o
		return o
	}
	owner := func(o *workflows.SandboxObjects, l map[string]string) {
		if o.Cluster == "" {
			o.Cluster, o.Namespace, o.Worker = l[LabelCluster], l[LabelNamespace], l[LabelWorker]
		}
		if o.Image == "" {
			o.Image = l[LabelImage]
		}
		if o.WorkspaceRoot == "" {
			o.WorkspaceRoot = l[LabelWorkspaceRoot]
		}
	}
	cs, err := a.docker.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		id := c.Labels[LabelSandboxID]
		if c.Labels[LabelRole] != roleSandbox || id == "" {
			continue
		}
		o := get(id)
		o.Container, o.ContainerState = strings.TrimPrefix(firstName(c.Names, c.ID), "/"), c.State
		if o.Image == "" {
			o.Image = c.Image
		}
		if t := time.Unix(c.Created, 0).UTC(); o.Created.IsZero() || t.Before(o.Created) {
			o.Created = t
		}
		owner(o, c.Labels)
	}
	vs, err := a.docker.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	for _, v := range vs.Volumes {
		if v == nil || v.Labels[LabelRole] != roleState || v.Labels[LabelSandboxID] == "" {
			continue
		}
		o := get(v.Labels[LabelSandboxID])
		o.Volume = v.Name
		if t, err := time.Parse(time.RFC3339, v.CreatedAt); err == nil && (o.Created.IsZero() || t.Before(o.Created)) {
			o.Created = t.UTC()
		}
		owner(o, v.Labels)
	}
	if du, err := a.docker.DiskUsage(ctx, types.DiskUsageOptions{Types: []types.DiskUsageObject{types.VolumeObject}}); err == nil {
		for _, v := range du.Volumes {
			if v == nil || v.UsageData == nil {
				continue
			}
			if o, ok := by[v.Labels[LabelSandboxID]]; ok && o.Volume == v.Name {
				o.VolumeBytes = v.UsageData.Size
			}
		}
	}
	out := make([]workflows.SandboxObjects, 0, len(by))
	for _, o := range by {
		out = append(out, *o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SandboxID < out[j].SandboxID })
	return out, nil
}

func firstName(names []string, id string) string {
	if len(names) > 0 {
		return names[0]
	}
	return id
}

// Owns reports whether a sandbox's objects are the deployment's that a
// serves (labelled with its cluster and namespace); unlabelled (older)
// objects count as its own only when they carry its worker id.
func Owns(a *Activities, o workflows.SandboxObjects) bool {
	cluster, ns := a.owner()
	if o.Cluster == "" {
		return a.cfg.WorkerID != "" && o.Worker == a.cfg.WorkerID
	}
	return o.Cluster == cluster && o.Namespace == ns
}
