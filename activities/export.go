package activities

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/archive"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
	"github.com/ephemeral-sandbox/sandbox/hostpath"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// Export formats of ExportSpec.Format.
const (
	FormatDir    = "dir"
	FormatTar    = "tar"
	FormatTarZst = "tar-zst"
	FormatPatch  = "patch"
)

// exportAttempts bounds how often an export is redone because the layer
// stack moved while it streamed.
const exportAttempts = 3

// errStackMoved: a publish landed while the export streamed, so the stream
// cannot be tied to one manifest version.
var errStackMoved = errors.New("the layer stack changed during the export")

func normalizeFormat(f string) (string, bool) {
	switch strings.ToLower(strings.ReplaceAll(f, "_", "-")) {
	case "", FormatDir:
		return FormatDir, true
	case FormatTar:
		return FormatTar, true
	case FormatTarZst, "tar.zst", "tzst":
		return FormatTarZst, true
	case FormatPatch:
		return FormatPatch, true
	case FormatGit:
		return FormatGit, true
	}
	return "", false
}

// ExportChanges exports everything published above the base (folded
// newest-wins) from the sandbox's daemon (export_layerstack) to the host.
//
//   - "dir" (default): applied to spec.Dest with archive.ApplyTar, which
//     validates the whole stream before touching Dest. Result keys:
//     manifest_version, format, layers_exported, files_written,
//     symlinks_written, deletes_applied, opaque_clears, skipped_unchanged,
//     bytes_written (file content bytes), and live_workspace_sessions when
//     sessions exist.
//   - "tar", "tar-zst": the OCI layer tar written to the file spec.Dest,
//     which must not exist (it appears complete or not at all). Result keys:
//     manifest_version, format, layers_exported, files_written,
//     symlinks_written, whiteouts_emitted (deletions and opaque markers),
//     bytes_written (archive bytes), counted by reading the tar as it is
//     written.
//   - "patch": a git-style patch written to the file spec.Dest likewise;
//     keys manifest_version, format, layers_exported, files_changed,
//     bytes_written.
//
// manifest_version and layers_exported come from the store's manifest,
// read through Docker before and after the stream: if a publish landed in
// between, the export is redone (nothing is applied or written before the
// versions agree).
func (a *Activities) ExportChanges(ctx context.Context, spec workflows.ExportSpec) (*api.ExportResult, error) {
	if err := checkSandboxID(spec.SandboxID); err != nil {
		return nil, err
	}
	format, ok := normalizeFormat(spec.Format)
	if !ok {
		return nil, invalidArgument("unknown export format %q (dir, tar, tar-zst, patch, git)", spec.Format)
	}
	if (format == FormatGit) != (spec.Branch != "") {
		return nil, invalidArgument("branch is required with format git, and only taken by it")
	}
	// Checked here again, as if a stranger sent the spec through Temporal.
	dest, err := a.cfg.HostPaths.Dest("dest", spec.Dest, format == FormatDir || format == FormatGit)
	if err != nil {
		return nil, hostPathError(err)
	}
	if format == FormatGit {
		if _, err := a.cfg.HostPaths.Workspace("dest", dest); err != nil { // an existing directory
			return nil, hostPathError(err)
		}
		if spec.WorkspaceRoot != "" && filepath.Clean(spec.WorkspaceRoot) != dest {
			return nil, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "dest", "dest": dest, "workspace_root": spec.WorkspaceRoot},
				"format git writes to the repository at the sandbox's workspace_root %s (the published paths are relative to it), not %s", spec.WorkspaceRoot, dest)
		}
		var streamed atomic.Int64
		stop := keepHeartbeating(ctx, heartbeatEvery, func() any { return map[string]any{"bytes": streamed.Load()} })
		defer stop()
		res, err := a.exportGit(ctx, spec, dest, &streamed)
		if err == nil {
			a.log.Info("changes exported", "sandbox_id", spec.SandboxID, "format", format, "dest", dest, "branch", spec.Branch, "tip", res.Tip)
		}
		return res, err
	}
	if format != FormatDir {
		if _, err := os.Lstat(dest); err == nil {
			return nil, conflict("export destination %s already exists; refusing to overwrite it", dest)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("export destination: %w", err)
		}
	}
	var streamed atomic.Int64
	stop := keepHeartbeating(ctx, heartbeatEvery, func() any { return map[string]any{"bytes": streamed.Load()} })
	defer stop()
	for attempt := 1; attempt <= exportAttempts; attempt++ {
		m, err := a.readManifest(ctx, spec.SandboxID)
		if err != nil {
			return nil, err
		}
		res, err := a.exportOnce(ctx, spec, format, dest, m, &streamed)
		if errors.Is(err, errStackMoved) {
			a.log.Info("export redone: the layer stack moved", "sandbox_id", spec.SandboxID, "attempt", attempt)
			continue
		}
		if err != nil {
			return nil, err
		}
		res.ManifestVersion = m.Version
		res.Format = format
		res.LayersExported = m.exported()
		a.log.Info("changes exported", "sandbox_id", spec.SandboxID, "format", format, "dest", dest, "manifest_version", m.Version)
		return res, nil
	}
	return nil, fmt.Errorf("export of sandbox %s: %w %d times in a row; try again", spec.SandboxID, errStackMoved, exportAttempts)
}

// exportOnce streams one export and applies or writes it.
func (a *Activities) exportOnce(ctx context.Context, spec workflows.ExportSpec, format, dest string, m manifest, streamed *atomic.Int64) (*api.ExportResult, error) {
	wire := FormatTar
	if format != FormatDir {
		wire = format
	}
	body, _ := json.Marshal(map[string]string{"format": wire})
	req, err := a.daemon.Request(ctx, http.MethodPost, spec.SandboxID, spec.Daemon, "/rpc/export_layerstack", body, "")
	if err != nil {
		return nil, activityError(err)
	}
	resp, err := a.daemon.Send(req, spec.SandboxID, "export_layerstack")
	if err != nil {
		return nil, activityError(err)
	}
	defer resp.Body.Close()
	stream := &exportStream{ctx: ctx, a: a, resp: resp, sandboxID: spec.SandboxID, version: m.Version, n: streamed}

	if format == FormatDir {
		openDest := func(create bool) (int, error) {
			f, err := hostpath.OpenDir("dest", dest, create)
			if err != nil {
				return -1, err
			}
			fd, err := unix.Dup(int(f.Fd()))
			f.Close()
			return fd, err
		}
		rep, err := archive.ApplyTar(ctx, stream, dest, archive.ApplyOptions{Mode: archive.ApplyChanges, OpenDest: openDest})
		if err != nil {
			if errors.Is(err, errStackMoved) {
				return nil, errStackMoved
			}
			var he *hostpath.Error
			if errors.As(err, &he) {
				return nil, hostPathError(err) // dest changed since it was checked
			}
			if stream.err != nil && !errors.Is(stream.err, errStackMoved) {
				return nil, stream.err // the daemon's own failure, or a lost connection
			}
			var ae *archive.ApplyError
			if errors.As(err, &ae) && ae.Phase == archive.PhaseValidate && ae.Reason != archive.ReasonIO && ae.Reason != archive.ReasonCanceled {
				return nil, apperr.Newf(api.KindOperationFailed, map[string]any{"path": ae.Path, "reason": ae.Reason},
					"export of sandbox %s refused: the layer stream is not a well-formed layer (%s at %s)", spec.SandboxID, ae.Reason, ae.Path)
			}
			return nil, fmt.Errorf("apply export of sandbox %s to %s: %w", spec.SandboxID, dest, err)
		}
		res := &api.ExportResult{FilesWritten: &rep.FilesWritten, SymlinksWritten: &rep.SymlinksWritten, DeletesApplied: &rep.DeletesApplied,
			OpaqueClears: &rep.OpaqueClears, SkippedUnchanged: &rep.SkippedUnchanged, BytesWritten: rep.BytesWritten}
		res.LiveWorkspaceSessions = a.liveSessions(ctx, spec)
		return res, nil
	}
	return a.writeExportFile(stream, format, dest)
}

// liveSessions lists the ids of the sandbox's workspace sessions (the
// seed's live_workspace_sessions: their work is not in the export); nil
// when there are none or the daemon does not say.
func (a *Activities) liveSessions(ctx context.Context, spec workflows.ExportSpec) []string {
	out, _, err := a.daemon.Do(ctx, daemonclient.Call{SandboxID: spec.SandboxID, Endpoint: spec.Daemon, Op: "list_workspace_sessions"})
	if err != nil {
		return nil
	}
	var list struct {
		Sessions []api.SessionInfo `json:"workspace_sessions"`
	}
	if json.Unmarshal(out, &list) != nil {
		return nil
	}
	var ids []string
	for _, s := range list.Sessions {
		ids = append(ids, s.WorkspaceSessionID)
	}
	return ids
}

// writeExportFile writes the stream to a temp file next to dest, counting
// entries as it goes, and links it into place only when complete. Dest's
// directory is opened (made) once, refusing a symlink anywhere in it
// (hostpath.OpenDir), and the temp file, its link and its removal all go
// through that descriptor: a directory swapped for a symlink after the
// check is never written through.
func (a *Activities) writeExportFile(stream io.Reader, format, dest string) (*api.ExportResult, error) {
	d, err := hostpath.OpenDir("dest", filepath.Dir(dest), true)
	if err != nil {
		var he *hostpath.Error
		if errors.As(err, &he) && he.Rule != hostpath.RuleMissing {
			return nil, hostPathError(err)
		}
		return nil, fmt.Errorf("export destination: %w", err)
	}
	defer d.Close()
	dfd, base := int(d.Fd()), filepath.Base(dest)
	f, tmp, err := atomicfile.CreateTempAt(dfd, "."+base+".eos-export-", 0o600)
	if err != nil {
		return nil, fmt.Errorf("export destination: %w", err)
	}
	defer func() {
		f.Close()
		_ = unix.Unlinkat(dfd, tmp, 0)
	}()

	pr, pw := io.Pipe()
	counted := make(chan exportCounts, 1)
	go func() {
		var c exportCounts
		if format == FormatPatch {
			c.err = countPatch(pr, &c)
		} else {
			c.err = countTar(pr, format == FormatTarZst, &c)
		}
		_, _ = io.Copy(io.Discard, pr) // never block the writer
		counted <- c
	}()
	n, err := io.Copy(io.MultiWriter(f, pw), stream)
	pw.CloseWithError(err)
	c := <-counted
	if err != nil {
		if errors.Is(err, errStackMoved) {
			return nil, errStackMoved
		}
		return nil, fmt.Errorf("write export %s: %w", dest, err)
	}
	if c.err != nil {
		return nil, fmt.Errorf("export stream is not a valid %s: %w", format, c.err)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("write export %s: %w", dest, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return nil, fmt.Errorf("write export %s: %w", dest, err)
	}
	if err := unix.Linkat(dfd, tmp, dfd, base, 0); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, conflict("export destination %s already exists; refusing to overwrite it", dest)
		}
		return nil, fmt.Errorf("write export %s: %w", dest, err)
	}
	_ = d.Sync()
	if format == FormatPatch {
		return &api.ExportResult{FilesChanged: &c.files, BytesWritten: n}, nil
	}
	return &api.ExportResult{FilesWritten: &c.files, SymlinksWritten: &c.symlinks, WhiteoutsEmitted: &c.whiteouts, BytesWritten: n}, nil
}

type exportCounts struct {
	files, symlinks, whiteouts int
	err                        error
}

// countTar counts a layer tar's entries: whiteouts (.wh.<name> and the
// opaque marker .wh..wh..opq), regular files and symlinks.
func countTar(r io.Reader, compressed bool, c *exportCounts) error {
	if compressed {
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(path.Base(hdr.Name), ".wh."):
			c.whiteouts++
		case hdr.Typeflag == tar.TypeReg:
			c.files++
		case hdr.Typeflag == tar.TypeSymlink:
			c.symlinks++
		}
	}
}

// countPatch counts the file diffs of a git-style patch.
func countPatch(r io.Reader, c *exportCounts) error {
	br := bufio.NewReaderSize(r, 64<<10)
	atStart := true
	for {
		line, err := br.ReadSlice('\n')
		if atStart && strings.HasPrefix(string(line), "diff --git ") {
			c.files++
		}
		atStart = !errors.Is(err, bufio.ErrBufferFull)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}

// exportStream is the export's body. At its end it checks the daemon's
// X-Export-Error trailer and that the manifest did not move, and reports
// either as the read error instead of io.EOF, so a consumer never takes an
// incomplete or unattributable stream for a complete one.
type exportStream struct {
	ctx       context.Context
	a         *Activities
	resp      *http.Response
	sandboxID string
	version   int64
	n         *atomic.Int64
	err       error
}

func (s *exportStream) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.resp.Body.Read(p)
	s.n.Add(int64(n))
	if errors.Is(err, io.EOF) {
		err = s.finish()
		if err == nil {
			err = io.EOF
		}
	}
	if err != nil {
		s.err = err
	}
	return n, err
}

func (s *exportStream) finish() error {
	if msg := s.resp.Trailer.Get("X-Export-Error"); msg != "" {
		return fmt.Errorf("the daemon's export failed: %s", msg)
	}
	m, err := s.a.readManifest(s.ctx, s.sandboxID)
	if err != nil {
		return err
	}
	if m.Version != s.version {
		return errStackMoved
	}
	return nil
}

// manifest is the part of the layer store's manifest the export reports.
type manifest struct {
	Version int64 `json:"version"`
	Layers  []struct {
		ID string `json:"layer_id"`
	} `json:"layers"`
}

// exported lists the layers above the base, newest first (as the store's
// export does).
func (m manifest) exported() []string {
	ids := []string{}
	for i := 0; i < len(m.Layers)-1; i++ {
		ids = append(ids, m.Layers[i].ID)
	}
	return ids
}

// readManifest reads the store's manifest out of the container (it is
// replaced by rename, so any read is a whole version). The daemon has no
// operation that reports the layer ids, so this is the one place that knows
// the store's path inside the state volume.
func (a *Activities) readManifest(ctx context.Context, sandboxID string) (manifest, error) {
	var m manifest
	name := workflows.ContainerName(sandboxID)
	rc, _, err := a.docker.CopyFromContainer(ctx, name, manifestPath)
	if cerrdefs.IsNotFound(err) {
		return m, notFound("sandbox %s has no layer stack to export (no container, or the base was never imported)", sandboxID)
	}
	if err != nil {
		return m, fmt.Errorf("read manifest of sandbox %s: %w", sandboxID, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		return m, fmt.Errorf("read manifest of sandbox %s: %w", sandboxID, err)
	}
	raw, err := io.ReadAll(io.LimitReader(tr, 16<<20))
	if err != nil {
		return m, fmt.Errorf("read manifest of sandbox %s: %w", sandboxID, err)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("manifest of sandbox %s: %w", sandboxID, err)
	}
	if len(m.Layers) == 0 {
		return m, fmt.Errorf("manifest of sandbox %s lists no layers", sandboxID)
	}
	return m, nil
}
