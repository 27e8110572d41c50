package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/daemonclient"
)

func TestRuntimeGoesToDaemon(t *testing.T) {
	secret := []byte("s3cret")
	var gotAuth, gotRID, gotPath string
	var gotBody map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotRID, gotPath = r.Header.Get("Authorization"), r.Header.Get("X-Request-Id"), r.URL.Path
		json.NewDecoder(r.Body).Decode(&gotBody)
		if gotPath == "/rpc/file_read" {
			w.WriteHeader(404)
			w.Write([]byte(`{"error":{"kind":"not_found","message":"no such file","details":{"path":"x"}}}`))
			return
		}
		w.Write([]byte(`{"status":"ok","exit_code":0}`))
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	b := &TemporalBackend{Secret: secret}
	b.remember("eos-1", api.Endpoint{Host: u.Hostname(), Port: port})
	ctx := context.WithValue(context.Background(), ctxKey{}, "rid-7")
	out, err := b.Runtime(ctx, "exec_command", "eos-1", map[string]any{"cmd": "ls"})
	if err != nil {
		t.Fatal(err)
	}
	if string(out.(json.RawMessage)) != `{"status":"ok","exit_code":0}` {
		t.Errorf("out %s", out)
	}
	if gotAuth != "Bearer "+daemonclient.Token(secret, "eos-1") || gotRID != "rid-7" || gotPath != "/rpc/exec_command" || gotBody["cmd"] != "ls" {
		t.Errorf("request: %q %q %q %v", gotAuth, gotRID, gotPath, gotBody)
	}
	_, err = b.Runtime(ctx, "file_read", "eos-1", map[string]any{"path": "x"})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Kind != api.KindNotFound || ae.Details["path"] != "x" {
		t.Errorf("error: %v", err)
	}
}

func TestMapErr(t *testing.T) {
	de := api.Error{Kind: "operation_failed", Message: "conflict", Details: map[string]any{"stage": "publish"}}
	err := mapErr("s", temporal.NewNonRetryableApplicationError("x", "DaemonError", nil, de))
	if e := api.AsError(err); e.Kind != "operation_failed" || e.Details["stage"] != "publish" {
		t.Errorf("%+v", e)
	}
	err = mapErr("s", temporal.NewApplicationError("sandbox s is creating", "NotReady"))
	if e := api.AsError(err); e.Kind != api.KindInvalidRequest {
		t.Errorf("%+v", e)
	}
	err = mapErr("s", temporal.NewApplicationError("workspace session not found: w", "NotFound"))
	if e := api.AsError(err); e.Kind != api.KindNotFound {
		t.Errorf("%+v", e)
	}
}
