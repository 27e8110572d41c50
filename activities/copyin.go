package activities

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// maxSkippedPaths bounds CopyReport.SkippedPaths.
const maxSkippedPaths = 20

// bootstrapTar is the one tar copied into a created sandbox container
// before it starts: the daemon binary (0755) and the daemon token (0600,
// root-owned, in a 0700 directory of the state volume).
func bootstrapTar(daemonBinary, token string) ([]byte, error) {
	bin, err := os.ReadFile(daemonBinary)
	if err != nil {
		return nil, invalidArgument("read daemon binary: %v", err)
	}
	now := time.Now()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: mode, ModTime: now})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), ModTime: now}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	// The small session init, when it was built next to the daemon (make
	// daemon): each idle session is that process instead of the daemon
	// binary (cmd/sandbox-sessinit).
	sessinit := func() error {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(daemonBinary), filepath.Base(SessinitPath)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read session init: %w", err)
		}
		return file(strings.TrimPrefix(SessinitPath, "/"), 0o755, b)
	}
	daemonDir := strings.TrimPrefix(filepath.Dir(DaemonPath), "/")
	var parts []string
	for p := range strings.SplitSeq(daemonDir, "/") {
		parts = append(parts, p)
		if err := dir(strings.Join(parts, "/"), 0o755); err != nil {
			return nil, err
		}
	}
	steps := []error{
		file(strings.TrimPrefix(DaemonPath, "/"), 0o755, bin),
		sessinit(),
		dir(strings.TrimPrefix(filepath.Dir(TokenPath), "/"), 0o700),
		file(strings.TrimPrefix(TokenPath, "/"), 0o600, []byte(token)),
		tw.Close(),
	}
	if err := errors.Join(steps...); err != nil {
		return nil, fmt.Errorf("build bootstrap tar: %w", err)
	}
	return buf.Bytes(), nil
}

// tokenTar is the tar copied into a created sandbox container that mounts
// the daemon volume: the daemon token (0600, root-owned, in a 0700
// directory of the state volume).
func tokenTar(token string) ([]byte, error) {
	now := time.Now()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := strings.TrimPrefix(filepath.Dir(TokenPath), "/")
	err := errors.Join(
		tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o700, ModTime: now}),
		tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(TokenPath, "/"), Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(token)), ModTime: now}),
	)
	if err == nil {
		_, err = tw.Write([]byte(token))
	}
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("build token tar: %w", err)
	}
	return buf.Bytes(), nil
}

// CopyWorkspace streams the host directory spec.WorkspaceRoot into the
// container's /eos/import/src as a tar, for the daemon's init_base. It
// copies everything, .git included (the daemon's import does the git-aware
// selection): regular files, directories and symlinks (as links, never
// followed) with their modes and mtimes. FIFOs, sockets and devices are
// skipped and counted. It heartbeats its progress.
//
// Repeating it overwrites what an earlier attempt copied; files removed
// from the host between attempts would stay in the import dir.
func (a *Activities) CopyWorkspace(ctx context.Context, spec workflows.SandboxSpec) (workflows.CopyReport, error) {
	if err := checkSandboxID(spec.SandboxID); err != nil {
		return workflows.CopyReport{}, err
	}
	if sb := spec.SharedBase; sb != nil && !sb.Leader {
		return workflows.CopyReport{}, nil // the group's leader imported the base
	}
	// A stranger may have sent the spec through Temporal: the gateway's
	// check is not trusted.
	root, err := a.cfg.HostPaths.Workspace("workspace_root", spec.WorkspaceRoot)
	if err != nil {
		return workflows.CopyReport{}, hostPathError(err)
	}
	c, err := a.inspectContainer(ctx, spec.SandboxID)
	if err != nil {
		return workflows.CopyReport{}, err
	}

	head := gitHeadOf(ctx, root) // the commit a git export builds on
	w := &workspaceTar{ctx: ctx, root: root, prefix: strings.TrimPrefix(ImportDir, "/")}
	stop := keepHeartbeating(ctx, heartbeatEvery, w.progress)
	defer stop()
	pr, pw := io.Pipe()
	werr := make(chan error, 1)
	go func() {
		err := w.stream(pw)
		pw.CloseWithError(err)
		werr <- err
	}()
	cerr := a.docker.CopyToContainer(ctx, c.ID, "/", pr, container.CopyToContainerOptions{})
	pr.CloseWithError(errors.New("copy to container ended"))
	if err := <-werr; err != nil {
		return workflows.CopyReport{}, fmt.Errorf("copy workspace %s: %w", root, err)
	}
	if cerr != nil {
		return workflows.CopyReport{}, fmt.Errorf("copy workspace %s into %s: %w", root, c.Name, cerr)
	}
	rep := w.report()
	rep.GitHead = head
	a.log.Info("workspace copied", "sandbox_id", spec.SandboxID, "root", root, "files", rep.Files,
		"dirs", rep.Dirs, "symlinks", rep.Symlinks, "bytes", rep.Bytes, "skipped", rep.Skipped)
	return rep, nil
}

// ImportWorkspace streams the host directory spec.WorkspaceRoot to the
// started sandbox's daemon as one tar (api.ImportBasePath), which imports it
// as the base in one pass: no tar on disk, no copy into the container
// through Docker, no second read of the tree. The tar is what CopyWorkspace
// sends (regular files, directories, symlinks as links, modes and mtimes;
// FIFOs, sockets and devices skipped and counted); the daemon checks every
// entry again. Repeating it is safe: the daemon answers the base it already
// has. It heartbeats its progress.
func (a *Activities) ImportWorkspace(ctx context.Context, in workflows.ImportWorkspaceInput) (workflows.ImportWorkspaceResult, error) {
	spec := in.Spec
	if err := checkSandboxID(spec.SandboxID); err != nil {
		return workflows.ImportWorkspaceResult{}, err
	}
	if sb := spec.SharedBase; sb != nil && !sb.Leader {
		return workflows.ImportWorkspaceResult{}, invalidArgument("sandbox %s follows a shared base: it initialises from the leader's base id, it imports nothing", spec.SandboxID)
	}
	if len(in.RequestID) > 256 {
		return workflows.ImportWorkspaceResult{}, invalidArgument("request id longer than 256 bytes")
	}
	root, err := a.cfg.HostPaths.Workspace("workspace_root", spec.WorkspaceRoot)
	if err != nil {
		return workflows.ImportWorkspaceResult{}, hostPathError(err)
	}
	// Where Docker publishes the daemon now (a retry after a container
	// restart finds its new port).
	c, err := a.inspectContainer(ctx, spec.SandboxID)
	if err != nil {
		return workflows.ImportWorkspaceResult{}, err
	}
	ep := daemonEndpoint(c)
	if c.State == nil || !c.State.Running || ep.Port == 0 {
		return workflows.ImportWorkspaceResult{}, fmt.Errorf("container %s is %s: no daemon to import into", c.Name, stateString(c))
	}
	head := gitHeadOf(ctx, root)
	w := &workspaceTar{ctx: ctx, root: root}
	pre := a.takePrefetch(spec.SandboxID, root, nil) // packed while the container was made
	if pre != nil {
		w = pre.w
	}
	stop := keepHeartbeating(ctx, heartbeatEvery, w.progress)
	defer stop()
	path := api.ImportBasePath
	if spec.ImportAll {
		path += "?all=true"
	}
	req, err := a.daemon.Request(ctx, http.MethodPost, spec.SandboxID, ep, path, nil, in.RequestID)
	if err != nil {
		if pre != nil {
			pre.pr.CloseWithError(errImportEnded)
		}
		return workflows.ImportWorkspaceResult{}, activityError(err)
	}
	a.daemon.UseDirect(ctx, req, daemonDirect(c)) // the tree skips Docker's proxy
	var pr *io.PipeReader
	var werr chan error
	if pre != nil {
		pr, werr = pre.pr, pre.werr
	} else {
		var pw *io.PipeWriter
		pr, pw = io.Pipe()
		werr = make(chan error, 1)
		go func() {
			err := w.stream(pw)
			pw.CloseWithError(err)
			werr <- err
		}()
	}
	req.Body = pr
	req.Header.Set("Content-Type", "application/x-tar")
	resp, serr := a.daemon.Send(req, spec.SandboxID, "import_base")
	var base api.InitBaseResult
	if serr == nil {
		serr = json.NewDecoder(io.LimitReader(resp.Body, daemonclient.MaxResponse)).Decode(&base)
		resp.Body.Close()
		if serr != nil {
			serr = fmt.Errorf("the daemon's answer to import_base does not decode: %w", serr)
		}
	}
	pr.CloseWithError(errImportEnded)
	herr := <-werr
	switch {
	case serr == nil:
		// Imported, or the daemon had its base already and answered
		// without reading on (the writer then stopped on the closed pipe).
	case herr != nil && !errors.Is(herr, errImportEnded) && !errors.Is(herr, io.ErrClosedPipe):
		// The host side failed first (a file that changed under the walk):
		// that is the cause, and retrying may pass; the daemon only saw
		// the stream break.
		return workflows.ImportWorkspaceResult{}, fmt.Errorf("stream workspace %s: %w", root, herr)
	default:
		return workflows.ImportWorkspaceResult{}, activityError(serr)
	}
	rep := w.report()
	rep.GitHead = head
	a.log.Info("workspace imported", "sandbox_id", spec.SandboxID, "root", root, "files", rep.Files,
		"dirs", rep.Dirs, "symlinks", rep.Symlinks, "bytes", rep.Bytes, "skipped", rep.Skipped, "base_id", base.BaseID,
		"already_initialized", base.AlreadyInitialized, "daemon_import", base.Import, "prefetched", pre != nil)
	return workflows.ImportWorkspaceResult{Copy: rep, Base: base}, nil
}

// errImportEnded stops the tar writer once the daemon answered.
var errImportEnded = errors.New("the import ended")

// workspaceTar writes a host tree as a tar under prefix ("": the tree's
// own names, the root as ".").
type workspaceTar struct {
	ctx    context.Context
	root   string
	prefix string
	mu     sync.Mutex
	rep    workflows.CopyReport
	buf    []byte
}

func (w *workspaceTar) progress() any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return map[string]any{"files": w.rep.Files, "bytes": w.rep.Bytes}
}

func (w *workspaceTar) report() workflows.CopyReport {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rep
}

func (w *workspaceTar) count(f func(r *workflows.CopyReport)) {
	w.mu.Lock()
	f(&w.rep)
	w.mu.Unlock()
}

// stream writes the tar to a pipe through a buffer: a tar is many small
// writes (a PAX record, a header, a small file's data, its padding), and
// each write to the pipe would be a hand-over to its reader (the HTTP or
// Docker sender) and, for the daemon's import, an HTTP chunk of its own.
func (w *workspaceTar) stream(pw io.Writer) error {
	bw := bufio.NewWriterSize(pw, 256<<10)
	if err := w.write(bw); err != nil {
		return err
	}
	return bw.Flush()
}

func (w *workspaceTar) write(out io.Writer) error {
	tw := tar.NewWriter(out)
	w.buf = make([]byte, 256<<10)
	// Parents of the import dir: only the daemon reads them.
	parts := strings.Split(w.prefix, "/")
	for i := 1; i < len(parts); i++ {
		if err := tw.WriteHeader(&tar.Header{Name: strings.Join(parts[:i], "/") + "/", Typeflag: tar.TypeDir, Mode: 0o700, ModTime: time.Now()}); err != nil {
			return err
		}
	}
	err := filepath.WalkDir(w.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := w.ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(w.root, p)
		if err != nil {
			return err
		}
		name := w.prefix
		switch {
		case w.prefix == "" && rel == ".":
			name = "." // a stream of the tree itself (ImportWorkspace)
		case w.prefix == "":
			name = filepath.ToSlash(rel)
		case rel != ".":
			name += "/" + filepath.ToSlash(rel)
		}
		return w.entry(tw, p, rel, name, d)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func (w *workspaceTar) entry(tw *tar.Writer, p, rel, name string, d fs.DirEntry) error {
	var fi fs.FileInfo
	var err error
	if rel == "." {
		fi, err = os.Stat(p)
	} else {
		fi, err = d.Info()
	}
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: name, Mode: tarMode(fi.Mode()), ModTime: fi.ModTime(), Format: tar.FormatPAX}
	switch {
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		w.count(func(r *workflows.CopyReport) { r.Dirs++ })
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, target, 0o777
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		w.count(func(r *workflows.CopyReport) { r.Symlinks++ })
	case fi.Mode().IsRegular():
		return w.file(tw, p, hdr)
	default:
		w.count(func(r *workflows.CopyReport) {
			r.Skipped++
			if len(r.SkippedPaths) < maxSkippedPaths {
				r.SkippedPaths = append(r.SkippedPaths, filepath.ToSlash(rel))
			}
		})
	}
	return nil
}

// file copies one regular file. It is opened without following a symlink
// swapped in since the walk saw it, and its size is taken from the open
// file; a file that shrinks while being copied is an error.
func (w *workspaceTar) file(tw *tar.Writer, p string, hdr *tar.Header) error {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s changed type during the copy", p)
	}
	hdr.Typeflag, hdr.Size, hdr.Mode, hdr.ModTime = tar.TypeReg, fi.Size(), tarMode(fi.Mode()), fi.ModTime()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(struct{ io.Reader }{f}, fi.Size()), w.buf)
	if err != nil {
		return fmt.Errorf("copy %s: %w", p, err)
	}
	if n != fi.Size() {
		return fmt.Errorf("%s shrank during the copy (%d of %d bytes)", p, n, fi.Size())
	}
	w.count(func(r *workflows.CopyReport) { r.Files++; r.Bytes += n })
	return nil
}

// tarMode is the permission bits plus setuid, setgid and sticky.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}
