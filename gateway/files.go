package gateway

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// rawFileRoutes serves the catalog's RawHTTP ops (file_upload as PUT,
// file_download as GET) at api.FilesPath with raw bytes: the route is a
// transport of the same op, dispatched (validated, routed, metered) like
// POST /v1/ops/<op>.
func (s *Server) rawFileRoutes(g *gin.RouterGroup) {
	path := strings.TrimPrefix(strings.ReplaceAll(api.FilesPath, "{sandbox_id}", ":id"), "/v1")
	for _, o := range api.PublicOps("") {
		if o.RawHTTP == "" {
			continue
		}
		op := o
		g.Handle(op.RawHTTP, path, func(c *gin.Context) { s.rawFileOp(c, &op) })
	}
}

func (s *Server) rawFileOp(c *gin.Context, op *api.Operation) {
	args := map[string]any{}
	for k, vs := range c.Request.URL.Query() {
		a, ok := op.Arg(k)
		if !ok || k == op.CLIUpload {
			abort(c, api.Errorf(api.KindInvalidRequest, map[string]any{"op": op.Name, "arg": k}, "unknown query parameter %q for %s", k, op.Name))
			return
		}
		if len(vs) != 1 {
			abort(c, api.Errorf(api.KindInvalidRequest, map[string]any{"op": op.Name, "arg": k}, "query parameter %q given %d times", k, len(vs)))
			return
		}
		switch a.Type {
		case api.TypeBool:
			b, err := strconv.ParseBool(vs[0])
			if err != nil {
				abort(c, api.Errorf(api.KindInvalidRequest, map[string]any{"op": op.Name, "arg": k}, "%s must be true or false", k))
				return
			}
			args[k] = b
		default:
			args[k] = vs[0]
		}
	}
	if op.CLIUpload != "" {
		sessionless := args["workspace_session_id"] == nil
		max := api.MaxTransferBytes
		if sessionless {
			max = api.MaxSessionlessUploadBytes
		}
		if c.Request.ContentLength > int64(max) {
			abort(c, api.CheckUploadSize(sessionless, int(c.Request.ContentLength)))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, int64(max)))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				abort(c, api.CheckUploadSize(sessionless, max+1))
				return
			}
			abort(c, api.Errorf(api.KindInvalidRequest, nil, "read body: %v", err))
			return
		}
		args[op.CLIUpload] = base64.StdEncoding.EncodeToString(body)
	}
	req := &jsonl.Request{Op: op.Name, RequestID: c.GetString("request_id"), Scope: jsonl.SandboxScope(c.Param("id")), Args: args}
	out, aerr := s.Dispatch(c.Request.Context(), req)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	if op.CLIDownload == "" {
		c.Data(http.StatusOK, "application/json", out)
		return
	}
	var res api.FileDownloadResult
	if err := json.Unmarshal(out, &res); err != nil {
		abort(c, api.Errorf(api.KindInternal, nil, "decode %s result: %v", op.Name, err))
		return
	}
	c.Header("X-Content-Sha256", res.SHA256)
	c.Header("X-Executable", strconv.FormatBool(res.Executable))
	c.Data(http.StatusOK, "application/octet-stream", res.Content)
}

// checkUpload refuses, before anything is sent on, an upload whose bytes
// exceed its cap (a sessionless one must fit a Temporal update).
func checkUpload(op *api.Operation, args map[string]any) *api.Error {
	if op.CLIUpload == "" {
		return nil
	}
	enc, _ := args[op.CLIUpload].(string)
	n := base64.StdEncoding.DecodedLen(len(enc)) - strings.Count(enc[max(0, len(enc)-2):], "=")
	ws, _ := args["workspace_session_id"].(string)
	if aerr := api.CheckUploadSize(ws == "", n); aerr != nil {
		aerr.Details["op"] = op.Name
		return aerr
	}
	return nil
}
