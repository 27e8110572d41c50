package worker

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/temporalio/cli/temporalcli/devserver"
	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uiserveroptions "github.com/temporalio/ui-server/v2/server/server_options"

	"github.com/ephemeral-sandbox/sandbox/hostcheck"
)

// uiCookie carries the UI login in the browser.
const uiCookie = "eos_temporal_ui"

// temporalUI is the embedded Temporal UI behind a login. The UI server
// itself listens on a private loopback port and forwards each request's
// Authorization header to the frontend; it holds no token, so whoever
// reaches that port directly gets the static pages and nothing else. The
// front on the configured address refuses a foreign Host, asks for the UI
// login (a secret-derived token, given once as ?login=<token> and then kept
// in an HttpOnly SameSite=Strict cookie), and only then proxies to the UI
// with the frontend token added.
type temporalUI struct {
	inner *uiserver.Server
	front *http.Server
	Addr  string
}

func startUI(addr, frontend, frontendToken, loginToken string, log *slog.Logger) (*temporalUI, error) {
	innerPort := devserver.MustGetFreePort("127.0.0.1")
	inner := uiserver.NewServer(uiserveroptions.WithConfigProvider(&uiconfig.Config{
		Host: "127.0.0.1", Port: innerPort, TemporalGRPCAddress: frontend, EnableUI: true,
		CORS: uiconfig.CORS{CookieInsecure: true}, HideLogs: true,
	}))
	go func() {
		if err := inner.Start(); err != nil {
			log.Error("temporal UI server", "err", err)
		}
	}()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		inner.Stop()
		return nil, fmt.Errorf("temporal UI listen %s: %w", addr, err)
	}
	target := &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(innerPort)}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
			r.Out.Header.Set("Authorization", "Bearer "+frontendToken)
		},
		ModifyResponse: func(resp *http.Response) error {
			for k := range resp.Header {
				if strings.HasPrefix(k, "Access-Control-") {
					resp.Header.Del(k)
				}
			}
			return nil
		},
	}
	h := hostcheck.For(l.Addr().String()).Handler(uiLogin(loginToken, proxy))
	ui := &temporalUI{inner: inner, Addr: l.Addr().String(),
		front: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}}
	go func() {
		if err := ui.front.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("temporal UI front", "err", err)
		}
	}()
	return ui, nil
}

// uiLogin admits a request carrying the login cookie; ?login=<token> sets
// it and redirects to the same path without the token.
func uiLogin(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	valid := func(v string) bool {
		got := sha256.Sum256([]byte(v))
		return v != "" && subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("login"); v != "" {
			if !valid(v) {
				http.Error(w, "wrong Temporal UI login", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q := r.URL.Query()
			q.Del("login")
			u := *r.URL
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
		c, err := r.Cookie(uiCookie)
		if err != nil || !valid(c.Value) {
			http.Error(w, "the Temporal UI needs the login URL the gateway printed at start (…/?login=<token>)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Stop stops the front and the UI server.
func (u *temporalUI) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = u.front.Shutdown(ctx)
	u.inner.Stop()
}
