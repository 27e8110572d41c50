package activities

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/imageref"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

const (
	roleSandbox = "sandbox" // LabelRole of the container
	roleState   = "state"   // LabelRole of the volume
)

var daemonPort = nat.Port(strconv.Itoa(DaemonPort) + "/tcp")

// sandboxIDPattern keeps sandbox ids usable in Docker names, labels and
// URLs.
var sandboxIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func checkSandboxID(id string) error {
	if !sandboxIDPattern.MatchString(id) {
		return invalidArgument("invalid sandbox id %q: 1-128 characters of [A-Za-z0-9_.-], starting with a letter or digit", id)
	}
	return nil
}

// labels are the labels of one of our objects. The token never goes here.
func (a *Activities) labels(sandboxID, role string, extra map[string]string) map[string]string {
	l := make(map[string]string, len(extra)+4)
	for k, v := range extra {
		l[k] = v
	}
	l[LabelManaged] = "true"
	l[LabelSandboxID] = sandboxID
	l[LabelRole] = role
	l[LabelWorker] = a.cfg.WorkerID
	if cluster, ns := a.owner(); cluster != "" {
		l[LabelCluster], l[LabelNamespace] = cluster, ns
	}
	return l
}

// sameOwner reports whether labelled objects belong to this deployment's
// cluster and namespace (a container an adopted orphan's old deployment
// made is recreated, so it carries the new owner; its volume keeps the work).
func (a *Activities) sameOwner(l map[string]string) bool {
	cluster, ns := a.owner()
	return cluster == "" || (l[LabelCluster] == cluster && l[LabelNamespace] == ns)
}

func labelsOf(c container.InspectResponse) map[string]string {
	if c.Config == nil {
		return nil
	}
	return c.Config.Labels
}

func isOurs(labels map[string]string, sandboxID string) bool {
	return labels[LabelManaged] == "true" && labels[LabelSandboxID] == sandboxID
}

// CheckImage fails with a non-retryable ErrImageNotFound unless image is
// present on this Docker host. Nothing is ever pulled.
func (a *Activities) CheckImage(ctx context.Context, img string) error {
	defer keepHeartbeating(ctx, heartbeatEvery, nil)()
	_, err := a.inspectImage(ctx, img)
	return err
}

func (a *Activities) inspectImage(ctx context.Context, img string) (image.InspectResponse, error) {
	// Checked here too, whoever started the workflow: a name Docker cannot
	// parse is the caller's error, not a Docker failure to retry.
	if err := imageref.Check(img); err != nil {
		return image.InspectResponse{}, apperr.New(api.AsError(err))
	}
	info, err := a.docker.ImageInspect(ctx, img)
	if cerrdefs.IsNotFound(err) {
		return info, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "image"},
			"image %s is not present on this Docker host; build or load it first (no pull is attempted)", img)
	}
	if cerrdefs.IsInvalidArgument(err) {
		return info, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "image"}, "image %s: the Docker Engine refused the name: %v", img, err)
	}
	if err != nil {
		return info, fmt.Errorf("inspect image %s: %w", img, err)
	}
	return info, nil
}

// checkBaseVolume refuses a shared base volume that is not ours: its name
// must be BaseVolumeName of a valid sandbox id, and an existing one must
// carry our labels for that leader (a caller must not get any volume of
// the Docker host mounted into a sandbox). With mustExist a missing volume
// is refused too (a follower mounts the leader's).
func (a *Activities) checkBaseVolume(ctx context.Context, name string, mustExist bool) error {
	leader, ok := strings.CutPrefix(name, workflows.BaseVolumeName(""))
	if !ok || checkSandboxID(leader) != nil {
		return invalidArgument("shared base volume %q is not one of ours (eos-base-<sandbox id>)", name)
	}
	v, err := a.docker.VolumeInspect(ctx, name)
	switch {
	case cerrdefs.IsNotFound(err):
		if mustExist {
			return invalidArgument("shared base volume %s does not exist", name)
		}
		return nil
	case err != nil:
		return fmt.Errorf("inspect volume %s: %w", name, err)
	}
	if !isOurs(v.Labels, leader) || v.Labels[LabelRole] != "base" {
		return invalidArgument("volume %s is not a shared base volume of ours (labels %v)", name, v.Labels)
	}
	return nil
}

// CreateVolume creates the sandbox's state volume, or returns the one an
// earlier attempt created. A volume of that name without our labels is a
// non-retryable ErrConflict: it may hold someone's data.
func (a *Activities) CreateVolume(ctx context.Context, spec workflows.SandboxSpec) (string, error) {
	if err := checkSandboxID(spec.SandboxID); err != nil {
		return "", err
	}
	defer keepHeartbeating(ctx, heartbeatEvery, nil)()
	if sb := spec.SharedBase; sb != nil && sb.Leader {
		if sb.Volume != workflows.BaseVolumeName(spec.SandboxID) {
			return "", invalidArgument("the leader of a group creates its own base volume %s, not %q", workflows.BaseVolumeName(spec.SandboxID), sb.Volume)
		}
		if err := a.checkBaseVolume(ctx, sb.Volume, false); err != nil {
			return "", err
		}
		if _, err := a.docker.VolumeInspect(ctx, sb.Volume); cerrdefs.IsNotFound(err) {
			if _, err := a.docker.VolumeCreate(ctx, volume.CreateOptions{Name: sb.Volume, Labels: a.labels(spec.SandboxID, "base", spec.Labels)}); err != nil {
				return "", fmt.Errorf("create shared base volume %s: %w", sb.Volume, err)
			}
		} else if err != nil {
			return "", fmt.Errorf("inspect volume %s: %w", sb.Volume, err)
		}
	}
	name := workflows.VolumeName(spec.SandboxID)
	v, err := a.docker.VolumeInspect(ctx, name)
	switch {
	case err == nil:
		if !isOurs(v.Labels, spec.SandboxID) {
			return "", conflict("volume %s exists but is not the state volume of sandbox %s (labels %v); remove it or pick another sandbox id", name, spec.SandboxID, v.Labels)
		}
		return name, nil
	case !cerrdefs.IsNotFound(err):
		return "", fmt.Errorf("inspect volume %s: %w", name, err)
	}
	if _, err := a.docker.VolumeCreate(ctx, volume.CreateOptions{Name: name, Labels: a.labels(spec.SandboxID, roleState, withAdoptLabels(spec))}); err != nil {
		return "", fmt.Errorf("create volume %s: %w", name, err)
	}
	a.log.Info("volume created", "sandbox_id", spec.SandboxID, "volume", name)
	return name, nil
}

// PrepareSandbox makes a spare sandbox's network and state volume side by
// side (workflows/standby.go): the Docker objects of a sandbox that need
// no image. Both are adopted when an earlier attempt made them, and
// CreateContainer adopts them once a claim names the image.
func (a *Activities) PrepareSandbox(ctx context.Context, spec workflows.SandboxSpec) error {
	if err := checkSandboxID(spec.SandboxID); err != nil {
		return err
	}
	defer keepHeartbeating(ctx, heartbeatEvery, nil)()
	netErr := make(chan error, 1)
	go func() { _, err := a.ensureNetwork(ctx, spec); netErr <- err }()
	_, volErr := a.CreateVolume(ctx, spec)
	if err := <-netErr; err != nil {
		return err // as is: a conflict stays a non-retryable application error
	}
	return volErr
}

// CreateContainer creates the sandbox container (not started) and copies
// the daemon binary and the daemon token into it. It is idempotent by the
// container name: a container of that name with our labels for this
// sandbox, created from the same image, is adopted (Adopted=true, the copy
// is redone unless it is running); any other is force-removed and
// recreated.
func (a *Activities) CreateContainer(ctx context.Context, spec workflows.SandboxSpec) (_ workflows.ContainerInfo, err error) {
	if err := checkSandboxID(spec.SandboxID); err != nil {
		return workflows.ContainerInfo{}, err
	}
	defer keepHeartbeating(ctx, heartbeatEvery, nil)()
	if a.cfg.DaemonBinary == "" {
		return workflows.ContainerInfo{}, invalidArgument("no daemon binary configured")
	}
	if strings.TrimSpace(a.cfg.SeccompProfile) == "" {
		return workflows.ContainerInfo{}, invalidArgument("no seccomp profile configured")
	}
	var seccomp bytes.Buffer
	if err := json.Compact(&seccomp, []byte(a.cfg.SeccompProfile)); err != nil {
		return workflows.ContainerInfo{}, invalidArgument("seccomp profile is not valid JSON: %v", err)
	}
	if spec.PrefetchWorkspace {
		// Packed while Docker works; ImportWorkspace checks the root again.
		if root, rerr := a.cfg.HostPaths.Workspace("workspace_root", spec.WorkspaceRoot); rerr == nil {
			a.startPrefetch(spec.SandboxID, root)
			defer func() {
				if err != nil { // no import follows this attempt; a retry packs again
					a.dropPrefetch(spec.SandboxID, root)
				}
			}()
		}
	}
	// Docker takes ~100 ms to make a network: the sandbox's is made while
	// the image and the volumes are checked, and waited for before the
	// container that joins it (and before any return: no create is left
	// running). A failure after it leaves a network, as it leaves a volume,
	// for the creation saga to remove.
	netErr := make(chan error, 1)
	go func() { _, err := a.ensureNetwork(ctx, spec); netErr <- err }()
	waitNetwork := sync.OnceValue(func() error { return <-netErr })
	defer waitNetwork()
	img, err := a.inspectImage(ctx, spec.Image)
	if err != nil {
		return workflows.ContainerInfo{}, err
	}
	// Docker would create a missing volume silently and without our labels.
	if _, err := a.CreateVolume(ctx, spec); err != nil {
		return workflows.ContainerInfo{}, err
	}
	if sb := spec.SharedBase; sb != nil {
		if err := a.checkBaseVolume(ctx, sb.Volume, true); err != nil {
			return workflows.ContainerInfo{}, err
		}
	}
	name := workflows.ContainerName(spec.SandboxID)
	dvol, err := a.ensureDaemonVolume(ctx, spec.Image, name)
	if err != nil {
		return workflows.ContainerInfo{}, err
	}
	if err := waitNetwork(); err != nil {
		return workflows.ContainerInfo{}, err
	}
	info := workflows.ContainerInfo{Name: name, Volume: workflows.VolumeName(spec.SandboxID)}
	for attempt := 0; ; attempt++ {
		existing, err := a.docker.ContainerInspect(ctx, name)
		switch {
		case err == nil:
			if isOurs(labelsOf(existing), spec.SandboxID) && existing.Image == img.ID && a.sameOwner(labelsOf(existing)) {
				info.ContainerID, info.Adopted, info.State = existing.ID, true, stateOf(existing)
				if existing.State != nil && existing.State.Running {
					info.Daemon, info.DaemonDirect = daemonEndpoint(existing), daemonDirect(existing)
					a.log.Info("container adopted", "sandbox_id", spec.SandboxID, "container", name, "running", true)
					return info, nil
				}
				if err := a.copyBootstrap(ctx, existing.ID, spec.SandboxID, mountsDaemonVolume(existing)); err != nil {
					return workflows.ContainerInfo{}, err
				}
				a.log.Info("container adopted", "sandbox_id", spec.SandboxID, "container", name, "running", false)
				return info, nil
			}
			a.log.Warn("replacing container", "sandbox_id", spec.SandboxID, "container", name,
				"image", existing.Image, "want_image", img.ID, "ours", isOurs(labelsOf(existing), spec.SandboxID))
			if err := a.docker.ContainerRemove(ctx, existing.ID, container.RemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
				return workflows.ContainerInfo{}, fmt.Errorf("remove container %s to recreate it: %w", name, err)
			}
		case !cerrdefs.IsNotFound(err):
			return workflows.ContainerInfo{}, fmt.Errorf("inspect container %s: %w", name, err)
		}

		cfg, hc := a.containerConfig(spec, seccomp.String(), dvol)
		created, err := a.docker.ContainerCreate(ctx, cfg, hc, nil, nil, name)
		if cerrdefs.IsConflict(err) && attempt < 3 {
			// Someone (an earlier attempt whose answer was lost) created it
			// meanwhile: look again.
			continue
		}
		if err != nil {
			return workflows.ContainerInfo{}, fmt.Errorf("create container %s: %w", name, err)
		}
		if ok, err := a.daemonVolumeStillVerified(ctx, dvol); !ok {
			// Removed since it was checked, and made again empty by this
			// very create: the container goes, the volume is made and
			// filled again, and the create tries once more.
			if rerr := a.removeContainer(ctx, created.ID); rerr != nil {
				return workflows.ContainerInfo{}, rerr
			}
			if err == nil && attempt < 3 {
				a.log.Warn("daemon volume changed under the create; filling it again", "sandbox_id", spec.SandboxID, "volume", dvol)
				if dvol, err = a.ensureDaemonVolume(ctx, spec.Image, name); err != nil {
					return workflows.ContainerInfo{}, err
				}
				continue
			}
			if err == nil {
				err = fmt.Errorf("daemon volume %s keeps changing under the create", dvol)
			}
			return workflows.ContainerInfo{}, err
		}
		// Its token is the argument --token-sha256 (containerConfig): no
		// copy into the container (Docker's copy into a created container
		// costs ~60 ms, a sixth of a 1k-file create).
		info.ContainerID, info.State = created.ID, "created"
		a.log.Info("container created", "sandbox_id", spec.SandboxID, "container", name, "image", spec.Image)
		return info, nil
	}
}

// lsmOpts take the sandbox container out of the Linux security module
// profile Docker would give it. Docker's AppArmor profile (docker-default,
// applied on every host with AppArmor on: Ubuntu, Debian, SUSE) denies every
// mount, and SELinux's container_t type (Fedora, RHEL with Docker's
// selinux-enabled) denies overlay mounts too: the daemon could start no
// session. What --privileged would do for both, without its capabilities or
// devices. On a host without either module Docker ignores them. The sessions
// stay confined by their namespaces, capabilities, seccomp filter and
// no_new_privs, and the sandbox container by its capability set and seccomp
// profile.
var lsmOpts = []string{"apparmor=unconfined", "label=disable"}

// containerConfig is the sandbox container: explicit capabilities on top of
// cap-drop ALL (never privileged), the custom seccomp profile, the state
// volume at /eos, the daemon volume (read-only) at DaemonDir, the daemon
// port on loopback only, the daemon as entrypoint, and the resource
// profile.
func (a *Activities) containerConfig(spec workflows.SandboxSpec, seccomp, daemonVolume string) (*container.Config, *container.HostConfig) {
	cfg := &container.Config{
		Image:        spec.Image,
		Entrypoint:   []string{DaemonPath},
		Cmd:          append(append([]string(nil), a.daemonArgs...), "--token-sha256="+tokenSHA256(a.token(spec.SandboxID))),
		Labels:       a.labels(spec.SandboxID, roleSandbox, withAdoptLabels(spec)),
		ExposedPorts: nat.PortSet{daemonPort: struct{}{}},
	}
	hc := &container.HostConfig{
		CapDrop:     []string{"ALL"},
		CapAdd:      append([]string(nil), sandboxCaps...),
		SecurityOpt: append([]string{"seccomp=" + seccomp}, lsmOpts...),
		// Isolated sessions reach the sandbox's uplink through it; the
		// daemon's nftables rules keep them from each other.
		Sysctls: map[string]string{"net.ipv4.ip_forward": "1"},
		// Alone on its own network: no other sandbox can reach it.
		NetworkMode: container.NetworkMode(networkName(spec.SandboxID)),
		Mounts: []mount.Mount{{
			Type: mount.TypeVolume, Source: workflows.VolumeName(spec.SandboxID), Target: StateDir,
		}, {
			Type: mount.TypeVolume, Source: daemonVolume, Target: DaemonDir, ReadOnly: true,
			VolumeOptions: &mount.VolumeOptions{NoCopy: true},
		}},
		PortBindings: nat.PortMap{daemonPort: []nat.PortBinding{{HostIP: "127.0.0.1", HostPort: ""}}},
		LogConfig:    container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "10m", "max-file": "3"}},
		// Back after a Docker Engine restart or a host reboot; the daemon
		// re-attaches its sessions and the callers follow its new port.
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyUnlessStopped},
	}
	cfg.Labels[LabelDaemonVolume] = daemonVolume
	if sb := spec.SharedBase; sb != nil {
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeVolume, Source: sb.Volume,
			Target: StateDir + "/layerstack/base", ReadOnly: !sb.Leader})
		cfg.Labels[LabelBaseVolume] = sb.Volume
	}
	p := spec.Profile
	hc.Memory = p.MemoryBytes
	if p.CPUs > 0 {
		hc.NanoCPUs = int64(p.CPUs * 1e9)
	}
	if p.PidsLimit > 0 {
		limit := p.PidsLimit
		hc.PidsLimit = &limit
	}
	return cfg, hc
}

// tokenSHA256 is what a new container's daemon checks tokens against: the
// token's SHA-256 in hex. It is in the container's argv (docker inspect,
// ps on the host), so it must not be the token: the token is an HMAC of
// 256 bits, whose digest gives nothing to present.
func tokenSHA256(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// copyBootstrap copies the daemon token (and, into a container made before
// the daemon volume, the daemon binary) into the (created, not yet started)
// container as one tar.
func (a *Activities) copyBootstrap(ctx context.Context, containerID, sandboxID string, tokenOnly bool) error {
	tarball, err := tokenTar(a.token(sandboxID))
	if !tokenOnly {
		tarball, err = bootstrapTar(a.cfg.DaemonBinary, a.token(sandboxID))
	}
	if err != nil {
		return err
	}
	if err := a.docker.CopyToContainer(ctx, containerID, "/", bytes.NewReader(tarball), container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("copy daemon binary and token into %s: %w", workflows.ContainerName(sandboxID), err)
	}
	return nil
}

// mountsDaemonVolume reports whether a container mounts a daemon volume
// (one made before them has the binary in its own file system).
func mountsDaemonVolume(c container.InspectResponse) bool {
	for _, m := range c.Mounts {
		if m.Destination == DaemonDir && strings.HasPrefix(m.Name, daemonVolumePref) {
			return true
		}
	}
	return false
}

// StartContainer starts the sandbox container (nothing to do if it runs)
// and returns where its daemon listens on the host.
func (a *Activities) StartContainer(ctx context.Context, sandboxID string) (workflows.ContainerInfo, error) {
	if err := checkSandboxID(sandboxID); err != nil {
		return workflows.ContainerInfo{}, err
	}
	defer keepHeartbeating(ctx, heartbeatEvery, nil)()
	name := workflows.ContainerName(sandboxID)
	c, err := a.inspectContainer(ctx, sandboxID)
	if err != nil {
		return workflows.ContainerInfo{}, err
	}
	if c.State == nil || !c.State.Running {
		if err := a.docker.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil && !cerrdefs.IsNotModified(err) {
			return workflows.ContainerInfo{}, fmt.Errorf("start container %s: %w", name, err)
		}
		if c, err = a.inspectContainer(ctx, sandboxID); err != nil {
			return workflows.ContainerInfo{}, err
		}
	}
	info := containerInfo(c, sandboxID)
	if c.State == nil || !c.State.Running {
		return info, fmt.Errorf("container %s is not running after start (%s)%s", name, stateString(c), a.logTail(ctx, c.ID))
	}
	if c.State.Restarting { // its daemon exited at once, and Docker restarts it (no port meanwhile)
		return info, a.restartLoop(ctx, sandboxID, c)
	}
	if info.Daemon.Port == 0 {
		return info, fmt.Errorf("container %s runs but has no host port published for %s", name, daemonPort)
	}
	a.log.Info("container started", "sandbox_id", sandboxID, "container", name, "port", info.Daemon.Port)
	return info, nil
}

// inspectContainer inspects the sandbox's container; a missing one is a
// non-retryable ErrNotFound.
func (a *Activities) inspectContainer(ctx context.Context, sandboxID string) (container.InspectResponse, error) {
	name := workflows.ContainerName(sandboxID)
	c, err := a.docker.ContainerInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return c, notFound("sandbox %s has no container (%s)", sandboxID, name)
	}
	if err != nil {
		return c, fmt.Errorf("inspect container %s: %w", name, err)
	}
	return c, nil
}

func containerInfo(c container.InspectResponse, sandboxID string) workflows.ContainerInfo {
	return workflows.ContainerInfo{ContainerID: c.ID, Name: workflows.ContainerName(sandboxID), Volume: workflows.VolumeName(sandboxID),
		Daemon: daemonEndpoint(c), DaemonDirect: daemonDirect(c), State: stateOf(c)}
}

// daemonDirect is the daemon's address on the container's network (its
// one network's IP and the daemon's port in the container), which a caller
// on this machine dials instead of Docker's proxy; nil when it has none.
func daemonDirect(c container.InspectResponse) *api.Endpoint {
	if c.NetworkSettings == nil || len(c.NetworkSettings.Ports[daemonPort]) == 0 {
		return nil // not published: not a daemon this product runs
	}
	ip := ""
	if len(c.NetworkSettings.Networks) == 1 {
		for _, n := range c.NetworkSettings.Networks {
			if n != nil {
				ip = n.IPAddress
			}
		}
	}
	return daemonclient.DirectOf(ip, daemonPort.Int())
}

func stateOf(c container.InspectResponse) string {
	if c.State == nil {
		return ""
	}
	return c.State.Status
}

// daemonEndpoint is the loopback host port Docker published for the daemon.
func daemonEndpoint(c container.InspectResponse) api.Endpoint {
	if c.NetworkSettings == nil {
		return api.Endpoint{}
	}
	for _, b := range c.NetworkSettings.Ports[daemonPort] {
		port, err := strconv.Atoi(b.HostPort)
		if err != nil || port == 0 {
			continue
		}
		host := b.HostIP
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		return api.Endpoint{Host: host, Port: port}
	}
	return api.Endpoint{}
}

func stateString(c container.InspectResponse) string {
	if c.State == nil {
		return "unknown state"
	}
	s := c.State.Status
	if !c.State.Running && c.State.FinishedAt != "" && c.State.Status == "exited" {
		s += fmt.Sprintf(", exit code %d", c.State.ExitCode)
	}
	if c.State.Error != "" {
		s += ": " + c.State.Error
	}
	return s
}

// logTail returns the last lines of the container's output for error
// messages (the daemon never logs its token).
func (a *Activities) logTail(ctx context.Context, containerID string) string {
	rc, err := a.docker.ContainerLogs(ctx, containerID, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "20"})
	if err != nil {
		return ""
	}
	defer rc.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, io.LimitReader(rc, 64<<10)); err != nil && out.Len() == 0 {
		return ""
	}
	s := strings.TrimSpace(out.String())
	if s == "" {
		return ""
	}
	return "; last output:\n" + s
}

// StopContainer stops the sandbox container (the daemon gets SIGTERM and
// its shutdown grace). A stopped or missing container is fine.
func (a *Activities) StopContainer(ctx context.Context, sandboxID string) error {
	if err := checkSandboxID(sandboxID); err != nil {
		return err
	}
	name := workflows.ContainerName(sandboxID)
	timeout := 15
	stop := keepHeartbeating(ctx, heartbeatEvery, nil)
	defer stop()
	err := a.docker.ContainerStop(ctx, name, container.StopOptions{Timeout: &timeout})
	if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsNotModified(err) {
		return fmt.Errorf("stop container %s: %w", name, err)
	}
	return nil
}

// RemoveSandbox force-removes the sandbox's container and state volume.
// Missing objects are fine, so it is safe to repeat.
func (a *Activities) RemoveSandbox(ctx context.Context, sandboxID string) error {
	if err := checkSandboxID(sandboxID); err != nil {
		return err
	}
	var baseVolume, daemonVolume string
	if c, err := a.docker.ContainerInspect(ctx, workflows.ContainerName(sandboxID)); err == nil && c.Config != nil {
		baseVolume, daemonVolume = c.Config.Labels[LabelBaseVolume], c.Config.Labels[LabelDaemonVolume]
	}
	if err := a.removeContainer(ctx, workflows.ContainerName(sandboxID)); err != nil {
		return err
	}
	if err := a.removeSandboxNetwork(ctx, sandboxID); err != nil {
		return err
	}
	if err := a.removeVolume(ctx, workflows.VolumeName(sandboxID)); err != nil {
		return err
	}
	if baseVolume != "" {
		// The last sandbox of a group takes the shared base with it; while
		// others still mount it, Docker refuses and it stays.
		if err := a.docker.VolumeRemove(ctx, baseVolume, false); err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
			a.log.Warn("remove shared base volume", "volume", baseVolume, "err", err)
		}
	}
	if strings.HasPrefix(daemonVolume, daemonVolumePref) {
		// An older build's daemon volume goes with its last sandbox.
		a.removeDaemonVolumeIfUnused(ctx, daemonVolume, a.currentDaemonVolume())
	}
	a.log.Info("sandbox removed", "sandbox_id", sandboxID)
	return nil
}

func (a *Activities) removeContainer(ctx context.Context, name string) error {
	err := a.docker.ContainerRemove(ctx, name, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove container %s: %w", name, err)
	}
	return nil
}

func (a *Activities) removeVolume(ctx context.Context, name string) error {
	var err error
	// A just-removed container can hold its volume for a moment.
	for i := 0; i < 10; i++ {
		err = a.docker.VolumeRemove(ctx, name, true)
		if err == nil || cerrdefs.IsNotFound(err) {
			return nil
		}
		if !cerrdefs.IsConflict(err) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("remove volume %s: %w", name, err)
}

// Inspect reports whether the sandbox's container exists, and its state
// and endpoint. (One result struct rather than (info, exists, error):
// Temporal activities return at most a result and an error.)
func (a *Activities) Inspect(ctx context.Context, sandboxID string) (InspectResult, error) {
	if err := checkSandboxID(sandboxID); err != nil {
		return InspectResult{}, err
	}
	c, err := a.docker.ContainerInspect(ctx, workflows.ContainerName(sandboxID))
	if cerrdefs.IsNotFound(err) {
		return InspectResult{}, nil
	}
	if err != nil {
		return InspectResult{}, fmt.Errorf("inspect container %s: %w", workflows.ContainerName(sandboxID), err)
	}
	return InspectResult{Exists: true, Container: containerInfo(c, sandboxID)}, nil
}

// Stats samples the container's resource use. It takes about a second:
// Docker measures CPU over one interval.
func (a *Activities) Stats(ctx context.Context, sandboxID string) (ContainerStats, error) {
	if err := checkSandboxID(sandboxID); err != nil {
		return ContainerStats{}, err
	}
	name := workflows.ContainerName(sandboxID)
	r, err := a.docker.ContainerStats(ctx, name, false)
	if cerrdefs.IsNotFound(err) {
		return ContainerStats{}, notFound("sandbox %s has no container (%s)", sandboxID, name)
	}
	if err != nil {
		return ContainerStats{}, fmt.Errorf("stats of %s: %w", name, err)
	}
	defer r.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
		return ContainerStats{}, fmt.Errorf("decode stats of %s: %w", name, err)
	}
	return statsOf(s), nil
}

// statsOf computes what `docker stats` shows.
func statsOf(s container.StatsResponse) ContainerStats {
	out := ContainerStats{MemoryLimit: s.MemoryStats.Limit, Pids: s.PidsStats.Current}
	cache := s.MemoryStats.Stats["total_inactive_file"] // cgroup v1
	if v, ok := s.MemoryStats.Stats["inactive_file"]; ok && cache == 0 {
		cache = v // cgroup v2
	}
	if s.MemoryStats.Usage > cache {
		out.MemoryBytes = s.MemoryStats.Usage - cache
	}
	cpu := float64(s.CPUStats.CPUUsage.TotalUsage) - float64(s.PreCPUStats.CPUUsage.TotalUsage)
	sys := float64(s.CPUStats.SystemUsage) - float64(s.PreCPUStats.SystemUsage)
	n := float64(s.CPUStats.OnlineCPUs)
	if n == 0 {
		n = float64(len(s.CPUStats.CPUUsage.PercpuUsage))
	}
	if cpu > 0 && sys > 0 && s.PreCPUStats.SystemUsage > 0 {
		out.CPUPercent = cpu / sys * n * 100
	}
	return out
}

// ListImages lists the images present on this Docker host.
func (a *Activities) ListImages(ctx context.Context) ([]workflows.ImageInfo, error) {
	list, err := a.docker.ImageList(ctx, image.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	out := make([]workflows.ImageInfo, 0, len(list))
	for _, im := range list {
		tags := []string{}
		for _, t := range im.RepoTags {
			if t != "<none>:<none>" {
				tags = append(tags, t)
			}
		}
		out = append(out, workflows.ImageInfo{ID: im.ID, Tags: tags, Size: im.Size, Created: im.Created})
	}
	return out, nil
}

// ListLeftovers lists the containers, networks and volumes labelled as ours (and, when
// a WorkerID is configured, as this worker's: another worker sharing the
// Docker host keeps its own).
func (a *Activities) ListLeftovers(ctx context.Context) ([]Leftover, error) {
	f := filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))
	if a.cfg.WorkerID != "" {
		f.Add("label", LabelWorker+"="+a.cfg.WorkerID)
	}
	cs, err := a.docker.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := []Leftover{}
	for _, c := range cs {
		name := c.ID
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		out = append(out, Leftover{Kind: "container", Name: name, SandboxID: c.Labels[LabelSandboxID]})
	}
	vs, err := a.docker.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	for _, v := range vs.Volumes {
		if v == nil {
			continue
		}
		out = append(out, Leftover{Kind: "volume", Name: v.Name, SandboxID: v.Labels[LabelSandboxID]})
	}
	ns, err := a.listNetworkLeftovers(ctx, f)
	if err != nil {
		return nil, err
	}
	return append(out, ns...), nil
}

// RemoveLeftovers removes every labelled container, network and volume (see
// ListLeftovers) whose sandbox keep says nobody owns, containers first, and
// returns what it removed. It is the worker-start reconciler's tool and runs
// without Temporal (it is registered like every method, but its predicate
// cannot cross Temporal: call it directly).
func (a *Activities) RemoveLeftovers(ctx context.Context, keep func(sandboxID string) bool) ([]Leftover, error) {
	all, err := a.ListLeftovers(ctx)
	if err != nil {
		return nil, err
	}
	removed := []Leftover{}
	var errs []error
	for _, kind := range []string{"container", "network", "volume"} {
		for _, l := range all {
			if l.Kind != kind || keep(l.SandboxID) {
				continue
			}
			var err error
			switch kind {
			case "container":
				err = a.removeContainer(ctx, l.Name)
			case "network":
				err = a.removeNetwork(ctx, l.Name)
			default:
				err = a.removeVolume(ctx, l.Name)
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			a.log.Info("leftover removed", "kind", l.Kind, "name", l.Name, "sandbox_id", l.SandboxID)
			removed = append(removed, l)
		}
	}
	return removed, errors.Join(errs...)
}

// Usage reads a sandbox container's counters once, without waiting for a
// second sample (Docker's one-shot stats): cumulative CPU time, memory,
// pids and block I/O. Cheap enough for a fleet-wide view.
func (a *Activities) Usage(ctx context.Context, sandboxID string) (workflows.ContainerUsage, error) {
	if err := checkSandboxID(sandboxID); err != nil {
		return workflows.ContainerUsage{}, err
	}
	name := workflows.ContainerName(sandboxID)
	r, err := a.docker.ContainerStatsOneShot(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return workflows.ContainerUsage{}, notFound("sandbox %s has no container (%s)", sandboxID, name)
	}
	if err != nil {
		return workflows.ContainerUsage{}, fmt.Errorf("stats of %s: %w", name, err)
	}
	defer r.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
		return workflows.ContainerUsage{}, fmt.Errorf("decode stats of %s: %w", name, err)
	}
	u := workflows.ContainerUsage{SampledAtUnixMS: s.Read.UnixMilli(), CPUUsageUsec: s.CPUStats.CPUUsage.TotalUsage / 1000,
		MemoryLimitBytes: s.MemoryStats.Limit, Pids: s.PidsStats.Current}
	if st := statsOf(s); st.MemoryBytes > 0 {
		u.MemoryCurrentBytes = st.MemoryBytes
	}
	for _, e := range s.BlkioStats.IoServiceBytesRecursive {
		switch strings.ToLower(e.Op) {
		case "read":
			u.IOReadBytes += e.Value
		case "write":
			u.IOWriteBytes += e.Value
		}
	}
	return u, nil
}

// DockerVersion answers whether the Docker Engine is reachable, with its
// version.
func (a *Activities) DockerVersion(ctx context.Context) (string, error) {
	v, err := a.docker.ServerVersion(ctx)
	if err != nil {
		return "", fmt.Errorf("docker engine: %w", err)
	}
	return v.Version + " (API " + v.APIVersion + ")", nil
}
