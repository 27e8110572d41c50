package activities

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// fakeDocker is an in-memory Docker Engine with just enough behaviour for
// the activities: images by reference, containers and volumes by name,
// copies recorded as tar bytes.
type fakeDocker struct {
	mu         sync.Mutex
	images     map[string]string // reference -> image id
	containers map[string]*container.InspectResponse
	volumes    map[string]volume.Volume
	networks   map[string]network.CreateOptions
	copies     []fakeCopy
	creates    []fakeCreate
	removed    []string
	nextID     int
	// files served by CopyFromContainer, by path; a func is called each time.
	files map[string]func() []byte
	// volData holds what was copied into a volume through a container
	// mounting it (volume -> file name -> contents); CopyFromContainer of
	// "<mount>/." serves it.
	volData map[string]map[string][]byte
	// onInspect, when set, changes a container before ContainerInspect
	// answers with it; checks counts the inspects so far.
	onInspect func(c *container.InspectResponse, checks int)
	inspects  int
	// logs is every container's output (stdout), as ContainerLogs frames it.
	logs string
	// beforeCreate, when set, runs (unlocked) before each ContainerCreate.
	beforeCreate func(name string)
}

type fakeCopy struct {
	container, path string
	data            []byte
}

type fakeCreate struct {
	name string
	cfg  *container.Config
	hc   *container.HostConfig
}

func newFakeDocker() *fakeDocker {
	return &fakeDocker{
		images:     map[string]string{"img:1": "sha256:aaaa", "img:2": "sha256:bbbb"},
		containers: map[string]*container.InspectResponse{},
		volumes:    map[string]volume.Volume{},
		networks:   map[string]network.CreateOptions{},
		files:      map[string]func() []byte{},
		volData:    map[string]map[string][]byte{},
	}
}

var _ Docker = (*fakeDocker)(nil)

func errNotFound(what string) error { return fmt.Errorf("%s: %w", what, cerrdefs.ErrNotFound) }

func (f *fakeDocker) ImageInspect(ctx context.Context, ref string, _ ...client.ImageInspectOption) (image.InspectResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.images[ref]
	if !ok && strings.ToLower(ref) != ref {
		// What the Engine answers a name the library parses (an upper-case
		// first part is a registry host) but it will not look up.
		return image.InspectResponse{}, fmt.Errorf("no such image: %s: invalid reference format: repository name must be lowercase: %w", ref, cerrdefs.ErrInvalidArgument)
	}
	if !ok {
		return image.InspectResponse{}, errNotFound("No such image: " + ref)
	}
	return image.InspectResponse{ID: id, RepoTags: []string{ref}}, nil
}

func (f *fakeDocker) ImageList(ctx context.Context, _ image.ListOptions) ([]image.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []image.Summary
	for ref, id := range f.images {
		out = append(out, image.Summary{ID: id, RepoTags: []string{ref, "<none>:<none>"}, Size: 42})
	}
	return out, nil
}

func (f *fakeDocker) VolumeCreate(ctx context.Context, o volume.CreateOptions) (volume.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.volumes[o.Name]; ok {
		return v, nil
	}
	f.nextID++
	v := volume.Volume{Name: o.Name, Labels: o.Labels, Driver: "local", CreatedAt: fmt.Sprintf("t%03d", f.nextID)}
	f.volumes[o.Name] = v
	return v, nil
}

func (f *fakeDocker) VolumeInspect(ctx context.Context, name string) (volume.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.volumes[name]
	if !ok {
		return v, errNotFound("no such volume")
	}
	return v, nil
}

func (f *fakeDocker) VolumeList(ctx context.Context, o volume.ListOptions) (volume.ListResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out volume.ListResponse
	for _, v := range f.volumes {
		if matchLabels(v.Labels, o.Filters.Get("label")) {
			v := v
			out.Volumes = append(out.Volumes, &v)
		}
	}
	return out, nil
}

func (f *fakeDocker) VolumeRemove(ctx context.Context, name string, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.volumes[name]; !ok {
		return errNotFound("no such volume")
	}
	for _, c := range f.containers {
		for _, m := range c.Mounts {
			if m.Name == name && !force {
				return fmt.Errorf("volume is in use: %w", cerrdefs.ErrConflict)
			}
		}
	}
	delete(f.volumes, name)
	delete(f.volData, name)
	f.removed = append(f.removed, "volume/"+name)
	return nil
}

func (f *fakeDocker) NetworkCreate(ctx context.Context, name string, o network.CreateOptions) (network.CreateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.networks[name]; ok {
		return network.CreateResponse{}, fmt.Errorf("network with name %s already exists: %w", name, cerrdefs.ErrConflict)
	}
	f.networks[name] = o
	return network.CreateResponse{ID: "net-" + name}, nil
}

func (f *fakeDocker) NetworkInspect(ctx context.Context, name string, _ network.InspectOptions) (network.Inspect, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.networks[name]
	if !ok {
		return network.Inspect{}, errNotFound("no such network")
	}
	return network.Inspect{Name: name, ID: "net-" + name, Driver: o.Driver, Internal: o.Internal, Labels: o.Labels, Options: o.Options}, nil
}

func (f *fakeDocker) NetworkList(ctx context.Context, o network.ListOptions) ([]network.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []network.Summary
	for name, n := range f.networks {
		if matchLabels(n.Labels, o.Filters.Get("label")) {
			out = append(out, network.Summary{Name: name, ID: "net-" + name, Labels: n.Labels})
		}
	}
	return out, nil
}

func (f *fakeDocker) NetworkRemove(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.networks[name]; !ok {
		return errNotFound("no such network")
	}
	for _, c := range f.containers {
		if c.HostConfig != nil && string(c.HostConfig.NetworkMode) == name {
			return fmt.Errorf("network %s has active endpoints: %w", name, cerrdefs.ErrConflict)
		}
	}
	delete(f.networks, name)
	f.removed = append(f.removed, "network/"+name)
	return nil
}

func matchLabels(labels map[string]string, want []string) bool {
	for _, w := range want {
		k, v, _ := strings.Cut(w, "=")
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (f *fakeDocker) ContainerCreate(ctx context.Context, cfg *container.Config, hc *container.HostConfig, _ *network.NetworkingConfig, _ *ocispec.Platform, name string) (container.CreateResponse, error) {
	if f.beforeCreate != nil {
		f.beforeCreate(name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.containers[name]; ok {
		return container.CreateResponse{}, fmt.Errorf("name in use: %w", cerrdefs.ErrConflict)
	}
	id, ok := f.images[cfg.Image]
	if !ok {
		return container.CreateResponse{}, errNotFound("no such image")
	}
	f.nextID++
	cid := fmt.Sprintf("c%03d", f.nextID)
	var mounts []container.MountPoint
	for _, m := range hc.Mounts {
		if _, ok := f.volumes[m.Source]; m.Type == mount.TypeVolume && !ok {
			// As Docker does: a missing named volume is made, empty and
			// without labels.
			f.nextID++
			f.volumes[m.Source] = volume.Volume{Name: m.Source, Driver: "local", CreatedAt: fmt.Sprintf("t%03d", f.nextID)}
		}
		mounts = append(mounts, container.MountPoint{Type: m.Type, Name: m.Source, Destination: m.Target, RW: !m.ReadOnly})
	}
	f.containers[name] = &container.InspectResponse{
		ContainerJSONBase: &container.ContainerJSONBase{ID: cid, Name: "/" + name, Image: id, Created: time.Now().Format(time.RFC3339Nano),
			State: &container.State{Status: "created"}, HostConfig: hc},
		Config:          cfg,
		NetworkSettings: &container.NetworkSettings{},
		Mounts:          mounts,
	}
	f.creates = append(f.creates, fakeCreate{name: name, cfg: cfg, hc: hc})
	return container.CreateResponse{ID: cid}, nil
}

// lookup finds a container by name or id.
func (f *fakeDocker) lookup(ref string) (string, *container.InspectResponse) {
	if c, ok := f.containers[ref]; ok {
		return ref, c
	}
	for name, c := range f.containers {
		if c.ID == ref {
			return name, c
		}
	}
	return "", nil
}

func (f *fakeDocker) ContainerInspect(ctx context.Context, ref string) (container.InspectResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, c := f.lookup(ref)
	if c == nil {
		return container.InspectResponse{}, errNotFound("No such container: " + ref)
	}
	if f.onInspect != nil {
		f.onInspect(c, f.inspects)
		f.inspects++
	}
	return *c, nil
}

func (f *fakeDocker) ContainerList(ctx context.Context, o container.ListOptions) ([]container.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []container.Summary
	for name, c := range f.containers {
		if matchLabels(c.Config.Labels, o.Filters.Get("label")) {
			created, _ := time.Parse(time.RFC3339Nano, c.Created)
			out = append(out, container.Summary{ID: c.ID, Names: []string{"/" + name}, Labels: c.Config.Labels, Created: created.Unix()})
		}
	}
	return out, nil
}

func (f *fakeDocker) ContainerStart(ctx context.Context, ref string, _ container.StartOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, c := f.lookup(ref)
	if c == nil {
		return errNotFound("no such container")
	}
	c.State = &container.State{Status: "running", Running: true}
	c.NetworkSettings.Ports = nat.PortMap{"7001/tcp": []nat.PortBinding{{HostIP: "127.0.0.1", HostPort: "49153"}}}
	return nil
}

func (f *fakeDocker) ContainerStop(ctx context.Context, ref string, _ container.StopOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, c := f.lookup(ref)
	if c == nil {
		return errNotFound("no such container")
	}
	c.State = &container.State{Status: "exited"}
	return nil
}

func (f *fakeDocker) ContainerRemove(ctx context.Context, ref string, _ container.RemoveOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name, c := f.lookup(ref)
	if c == nil {
		return errNotFound("no such container")
	}
	delete(f.containers, name)
	f.removed = append(f.removed, "container/"+name)
	return nil
}

func (f *fakeDocker) ContainerStats(ctx context.Context, ref string, stream bool) (container.StatsResponseReader, error) {
	return container.StatsResponseReader{}, errors.New("fake: no stats")
}

func (f *fakeDocker) ContainerStatsOneShot(ctx context.Context, ref string) (container.StatsResponseReader, error) {
	return container.StatsResponseReader{}, errors.New("fake: no stats")
}

func (f *fakeDocker) ServerVersion(ctx context.Context) (types.Version, error) {
	return types.Version{Version: "fake", APIVersion: "1.41"}, nil
}

func (f *fakeDocker) ContainerLogs(ctx context.Context, ref string, _ container.LogsOptions) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b bytes.Buffer
	if f.logs != "" {
		_, _ = stdcopy.NewStdWriter(&b, stdcopy.Stdout).Write([]byte(f.logs))
	}
	return io.NopCloser(&b), nil
}

func (f *fakeDocker) CopyToContainer(ctx context.Context, ref, dst string, content io.Reader, _ container.CopyToContainerOptions) error {
	data, err := io.ReadAll(content)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, c := f.lookup(ref)
	if c == nil {
		return errNotFound("no such container")
	}
	f.copies = append(f.copies, fakeCopy{container: c.ID, path: dst, data: data})
	for _, m := range c.Mounts {
		if m.Destination != dst {
			continue
		}
		if !m.RW {
			return errors.New("read-only file system")
		}
		ents, _, err := readTar(data)
		if err != nil {
			return err
		}
		if f.volData[m.Name] == nil {
			f.volData[m.Name] = map[string][]byte{}
		}
		for n, e := range ents {
			f.volData[m.Name][n] = e.data
		}
	}
	return nil
}

func (f *fakeDocker) CopyFromContainer(ctx context.Context, ref, src string) (io.ReadCloser, container.PathStat, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, c := f.lookup(ref)
	for _, m := range mountsOf(c) {
		if src == m.Destination+"/." {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for n, data := range f.volData[m.Name] {
				_ = tw.WriteHeader(&tar.Header{Name: "./" + n, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))})
				_, _ = tw.Write(data)
			}
			_ = tw.Close()
			return io.NopCloser(&buf), container.PathStat{Name: "."}, nil
		}
	}
	gen, ok := f.files[src]
	if c == nil || !ok {
		return nil, container.PathStat{}, errNotFound("no such file or container")
	}
	data := gen()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: src[strings.LastIndex(src, "/")+1:], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
	_, _ = tw.Write(data)
	_ = tw.Close()
	return io.NopCloser(&buf), container.PathStat{Name: src, Size: int64(len(data))}, nil
}

func mountsOf(c *container.InspectResponse) []container.MountPoint {
	if c == nil {
		return nil
	}
	return c.Mounts
}

// tarEntry is one entry of a recorded copy.
type tarEntry struct {
	hdr  *tar.Header
	data []byte
}

func readTar(data []byte) (map[string]tarEntry, []string, error) {
	tr := tar.NewReader(bytes.NewReader(data))
	out := map[string]tarEntry{}
	var order []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, order, nil
		}
		if err != nil {
			return nil, nil, err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, err
		}
		out[h.Name] = tarEntry{hdr: h, data: b}
		order = append(order, h.Name)
	}
}

func (f *fakeDocker) DiskUsage(ctx context.Context, _ types.DiskUsageOptions) (types.DiskUsage, error) {
	return types.DiskUsage{}, nil
}
