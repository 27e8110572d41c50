package cli

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// localFile is the client side of the catalog's CLIUpload / CLIDownload:
// --from LOCALFILE fills the upload arg with the file's bytes, --to
// LOCALFILE receives the download field's bytes (--force to overwrite).
// These are the caller's own files: no host path policy applies.
type localFile struct {
	from, to string
	force    bool
}

func addLocalFileFlags(op api.Operation, fs *pflag.FlagSet) *localFile {
	lf := &localFile{}
	if op.CLIUpload != "" {
		fs.StringVar(&lf.from, "from", "", "local file whose bytes to send as --"+kebab(op.CLIUpload))
	}
	if op.CLIDownload != "" {
		fs.StringVar(&lf.to, "to", "", "local file to write the bytes to (the JSON line then omits "+op.CLIDownload+")")
		fs.BoolVar(&lf.force, "force", false, "with --to: replace an existing local file")
	}
	return lf
}

// fill reads --from into values before the args are built.
func (lf *localFile) fill(op api.Operation, values map[string]*argValue) error {
	if lf.from == "" {
		return nil
	}
	v := values[op.CLIUpload]
	if v.set {
		return usage("give --from or --%s, not both", kebab(op.CLIUpload))
	}
	f, err := os.Open(lf.from)
	if err != nil {
		return usage("--from: %v", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return usage("--from %s is not a regular file", lf.from)
	}
	b, err := io.ReadAll(io.LimitReader(f, api.MaxTransferBytes+1))
	if err != nil {
		return usage("--from: %v", err)
	}
	if aerr := api.CheckUploadSize(false, len(b)); aerr != nil {
		return &exitError{code: ExitUsage, err: aerr}
	}
	v.set, v.value = true, base64.StdEncoding.EncodeToString(b)
	return nil
}

// check refuses, before anything is sent, a --to that would overwrite a
// file without --force or is not a place a file can be written.
func (lf *localFile) check() error {
	if lf.to == "" {
		return nil
	}
	fi, err := os.Lstat(lf.to)
	switch {
	case err == nil && fi.IsDir():
		return usage("--to %s is a directory", lf.to)
	case err == nil && !lf.force:
		return usage("--to %s exists: pass --force to replace it", lf.to)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return usage("--to: %v", err)
	}
	return nil
}

// write stores the downloaded field in --to (a temp file renamed into
// place, so a failed download leaves no partial file) and returns the
// result without the bytes.
func (lf *localFile) write(op api.Operation, out []byte) ([]byte, error) {
	if lf.to == "" {
		return out, nil
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, &exitError{code: ExitError, err: api.Errorf(api.KindInternal, nil, "bad response: %v", err)}
	}
	var b []byte
	if err := json.Unmarshal(res[op.CLIDownload], &b); err != nil {
		return nil, &exitError{code: ExitError, err: api.Errorf(api.KindInternal, nil, "bad %s in the response: %v", op.CLIDownload, err)}
	}
	fail := func(err error) error {
		return &exitError{code: ExitError, err: api.Errorf(api.KindOperationFailed, map[string]any{"to": lf.to}, "write %s: %v", lf.to, err)}
	}
	tmp, err := os.CreateTemp(filepath.Dir(lf.to), "."+filepath.Base(lf.to)+".download-*")
	if err != nil {
		return nil, fail(err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if lf.force {
			err = os.Rename(tmp.Name(), lf.to)
		} else if err = os.Link(tmp.Name(), lf.to); err == nil { // never replaces a file made meanwhile
			_ = os.Remove(tmp.Name())
		}
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return nil, fail(err)
	}
	delete(res, op.CLIDownload)
	res["local_path"], _ = json.Marshal(lf.to)
	res["local_bytes_written"], _ = json.Marshal(len(b))
	return json.Marshal(res)
}
