package layerstack

import (
	"github.com/ephemeral-sandbox/sandbox/archive"

	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"

	"github.com/klauspost/compress/zstd"
)

// ExportFormat is the encoding of an export stream.
type ExportFormat string

const (
	ExportTar    ExportFormat = "tar"     // OCI layer tar: .wh. whiteouts, .wh..wh..opq markers
	ExportTarZst ExportFormat = "tar-zst" // the same, zstd-compressed
	ExportPatch  ExportFormat = "patch"   // git-style unified diff of the head against the base
)

// ExportResult describes an export stream.
type ExportResult struct {
	ManifestVersion int64         `json:"manifest_version"`
	Format          ExportFormat  `json:"format"`
	LayersExported  []string      `json:"layers_exported"`
	Entries         ExportEntries `json:"entries"`
	Bytes           int64         `json:"bytes"`
}

// ExportEntries counts what the stream carries.
type ExportEntries struct {
	Files     int `json:"files"`
	Dirs      int `json:"dirs"`
	Symlinks  int `json:"symlinks"`
	Whiteouts int `json:"whiteouts"`
	Opaques   int `json:"opaques"`
}

// Export streams everything published above the base, folded into one
// change set, to w. Sessions can go on working meanwhile: the export holds a
// lease on the head it reads.
func (s *Store) Export(ctx context.Context, w io.Writer, format ExportFormat) (*ExportResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	lease, err := s.Acquire("export")
	if err != nil {
		return nil, err
	}
	defer func() { _ = s.Release(lease.ID) }()
	res := &ExportResult{ManifestVersion: lease.ManifestVersion, Format: format, LayersExported: []string{}}
	for _, l := range lease.Layers[:len(lease.Layers)-1] {
		res.LayersExported = append(res.LayersExported, l.ID)
	}
	dirs := s.stackOf(lease.Layers)
	n := dirs.len()
	base, run := dirs.slice(n-1, n), dirs.slice(0, n-1)
	cw := &countingWriter{w: w}
	switch format {
	case ExportTar, ExportTarZst, "":
		res.Format = ExportTar
		var out io.Writer = cw
		var zw *zstd.Encoder
		if format == ExportTarZst {
			res.Format = format
			if zw, err = zstd.NewWriter(cw); err != nil {
				return nil, err
			}
			out = zw
		}
		tw := tar.NewWriter(out)
		sink := &tarSink{tw: tw, res: res}
		f := &folder{ctx: ctx, run: run, below: base, sink: sink}
		if err := f.fold(); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		if err := tw.Close(); err != nil {
			return nil, err
		}
		if zw != nil {
			if err := zw.Close(); err != nil {
				return nil, err
			}
		}
	case ExportPatch:
		sink := &patchSink{w: cw, base: base, head: dirs, res: res}
		f := &folder{ctx: ctx, run: run, below: base, sink: sink}
		if err := f.fold(); err != nil {
			return nil, fmt.Errorf("export: %w", err)
		}
		if sink.err != nil {
			return nil, sink.err
		}
	default:
		return nil, fmt.Errorf("%w: unknown export format %q (tar, tar-zst, patch)", ErrBadRequest, format)
	}
	res.Bytes = cw.n
	return res, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// tarSink writes a fold as an OCI layer tar.
type tarSink struct {
	tw  *tar.Writer
	res *ExportResult
}

func (t *tarSink) hdr(fi fs.FileInfo, name string, typ byte) *tar.Header {
	h := &tar.Header{Name: name, Typeflag: typ, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX}
	return h
}

func (t *tarSink) dir(p string, fi fs.FileInfo, opaque bool) error {
	if err := t.tw.WriteHeader(t.hdr(fi, p+"/", tar.TypeDir)); err != nil {
		return err
	}
	t.res.Entries.Dirs++
	if opaque {
		t.res.Entries.Opaques++
		return t.tw.WriteHeader(&tar.Header{Name: p + "/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX})
	}
	return nil
}

func (t *tarSink) file(p, full string, fi fs.FileInfo) error {
	h := t.hdr(fi, p, tar.TypeReg)
	h.Size = fi.Size()
	f, err := os.Open(full)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := io.CopyN(t.tw, f, fi.Size()); err != nil {
		return err
	}
	t.res.Entries.Files++
	return nil
}

func (t *tarSink) symlink(p, target string, fi fs.FileInfo) error {
	h := t.hdr(fi, p, tar.TypeSymlink)
	h.Linkname = target
	t.res.Entries.Symlinks++
	return t.tw.WriteHeader(h)
}

func (t *tarSink) whiteout(p string) error {
	t.res.Entries.Whiteouts++
	name := path.Join(parentOf(p), ".wh."+baseName(p))
	return t.tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX})
}

// ExportToDir applies the export to a host directory with the hardened
// applier, exactly as a host that distrusts the sandbox would.
func (s *Store) ExportToDir(ctx context.Context, dest string) (*ExportResult, *archive.ApplyReport, error) {
	pr, pw := io.Pipe()
	type out struct {
		res *ExportResult
		err error
	}
	ch := make(chan out, 1)
	go func() {
		res, err := s.Export(ctx, pw, ExportTar)
		pw.CloseWithError(err)
		ch <- out{res, err}
	}()
	rep, aerr := archive.ApplyTar(ctx, pr, dest, archive.ApplyOptions{Mode: archive.ApplyChanges})
	pr.CloseWithError(fmt.Errorf("applier stopped"))
	o := <-ch
	if o.err != nil {
		return nil, nil, o.err
	}
	if aerr != nil {
		return nil, nil, aerr
	}
	return o.res, &rep, nil
}
