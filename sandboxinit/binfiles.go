package sandboxinit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// fileUpload writes any bytes to a file: into a session's workspace by the
// same descriptor-confined atomic replace as file_write, or, without a
// session, as one published layer (the workflow's amend update). The size
// is checked before anything is opened, so a refused upload writes nothing.
func (d *Daemon) fileUpload(ctx context.Context, rid string, a api.FileUploadArgs) (*api.FileUploadResult, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	if p == "" {
		return nil, api.Errorf(api.KindInvalidRequest, map[string]any{"path": a.Path}, "path names the workspace root, not a file")
	}
	if aerr := api.CheckUploadSize(a.WorkspaceSessionID == "", len(a.Content)); aerr != nil {
		aerr.Details["path"] = a.Path
		return nil, aerr
	}
	typ, err := d.putFile(ctx, "file_upload:"+rid, rid, a.WorkspaceSessionID, a.Path, p, a.Content, a.Executable)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(a.Content)
	return &api.FileUploadResult{Type: typ, Path: a.Path, BytesWritten: len(a.Content), SHA256: hex.EncodeToString(sum[:])}, nil
}

// fileDownload returns a regular file's bytes, whatever they are, from a
// session's workspace (descriptor-confined, never following a symlink) or
// the published head.
func (d *Daemon) fileDownload(a api.FileDownloadArgs) (*api.FileDownloadResult, error) {
	p, err := workspacePath(a.Path)
	if err != nil {
		return nil, err
	}
	v, err := d.view(a.WorkspaceSessionID)
	if err != nil {
		return nil, err
	}
	defer v.close()
	b, mode, err := v.readAll(p, api.MaxTransferBytes)
	if err != nil {
		if ae := api.AsError(err); ae.Kind == api.KindInvalidRequest && ae.Details["limit"] == int64(api.MaxTransferBytes) {
			// Too large: a budget, as the upload's.
			return nil, api.Errorf(api.KindResourceExhausted, map[string]any{"path": a.Path, "limit": "max_transfer_bytes",
				"max": api.MaxTransferBytes, "size": ae.Details["size"]}, "%s has %v bytes, more than max_transfer_bytes (%d)", a.Path, ae.Details["size"], api.MaxTransferBytes)
		}
		return nil, err
	}
	sum := sha256.Sum256(b)
	return &api.FileDownloadResult{Path: a.Path, Content: b, Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:]), Executable: mode&0o111 != 0}, nil
}
