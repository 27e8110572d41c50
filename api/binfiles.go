package api

import "fmt"

// Caps of file_upload and file_download: a file crosses the daemon's RPC and
// the gateway's doors whole, base64-encoded inside one JSON body of at most
// 16 MiB, so a file has at most MaxTransferBytes. A sessionless upload
// travels in a Temporal update (2 MiB payload limit) and has at most
// MaxSessionlessUploadBytes: upload bigger files into a session.
const (
	MaxTransferBytes          = 8 << 20
	MaxSessionlessUploadBytes = 1 << 20
)

// FileUploadArgs are file_upload's arguments. Content is any bytes
// (content_base64 on the wire, standard encoding with padding).
type FileUploadArgs struct {
	Path               string `json:"path"`
	Content            []byte `json:"content_base64"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	Executable         *bool  `json:"executable,omitempty"`
}

// FileUploadResult is file_upload's result.
type FileUploadResult struct {
	Type         string `json:"type"` // create or update
	Path         string `json:"path"`
	BytesWritten int    `json:"bytes_written"`
	SHA256       string `json:"sha256"`
}

// FileDownloadArgs are file_download's arguments.
type FileDownloadArgs struct {
	Path               string `json:"path"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
}

// FileDownloadResult is file_download's result: the file's bytes
// (content_base64 on the wire), size, digest and exec bit.
type FileDownloadResult struct {
	Path       string `json:"path"`
	Content    []byte `json:"content_base64"`
	Size       int64  `json:"size"`
	SHA256     string `json:"sha256"`
	Executable bool   `json:"executable"`
}

// MaxUpdateArgsBytes caps the arguments of an operation that runs as a
// durable Temporal update (a sessionless file_write, file_edit or
// file_upload, a publish's message, ...), as JSON: Temporal records them in
// the sandbox workflow's history, whose events are at most 2 MiB, and an
// update over that fails the workflow's task and holds up every update of
// the sandbox until it times out. Bigger content goes into a session.
const MaxUpdateArgsBytes = 1536 << 10

// CheckUpdateArgsSize refuses the arguments of durable update op that take
// n bytes as JSON, over MaxUpdateArgsBytes, with resource_exhausted
// (details.limit, max, size, op).
func CheckUpdateArgsSize(op string, n int) *Error {
	if n <= MaxUpdateArgsBytes {
		return nil
	}
	return Errorf(KindResourceExhausted, map[string]any{"limit": "max_update_args_bytes", "max": MaxUpdateArgsBytes, "size": n, "op": op},
		"%s's arguments take %d bytes, more than max_update_args_bytes (%d) for an operation recorded in the sandbox's workflow; write large content in a workspace session (up to %d bytes a file) and publish that",
		op, n, MaxUpdateArgsBytes, MaxTransferBytes)
}

// CheckUploadSize refuses an upload of n bytes over its cap with
// resource_exhausted (details.limit, details.max, details.size).
func CheckUploadSize(sessionless bool, n int) *Error {
	max, limit, hint := MaxTransferBytes, "max_transfer_bytes", "files larger than that cannot be uploaded"
	if sessionless {
		max, limit, hint = MaxSessionlessUploadBytes, "max_sessionless_upload_bytes", fmt.Sprintf("upload it into a workspace session (up to %d bytes) and publish that", MaxTransferBytes)
	}
	if n <= max {
		return nil
	}
	return Errorf(KindResourceExhausted, map[string]any{"limit": limit, "max": max, "size": n},
		"the upload has %d bytes, more than %s (%d); %s", n, limit, max, hint)
}
