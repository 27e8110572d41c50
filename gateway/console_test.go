package gateway

import (
	"bufio"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// consoleReq sends one request to a served gateway with the given headers.
func consoleReq(t *testing.T, addr, method, path, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// consoleSignedIn mints a code with the bearer token and exchanges it.
func consoleSignedIn(t *testing.T, addr string) (cookie, csrf string) {
	t.Helper()
	resp, body := consoleReq(t, addr, "POST", "/console/code", "", map[string]string{"Authorization": "Bearer " + testToken})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	code := body[strings.Index(body, `"code":"`)+8:]
	code = code[:strings.Index(code, `"`)]
	require.Contains(t, body, `"url":"http://`+addr+`/#login=`+code+`"`)
	resp, body = consoleReq(t, addr, "POST", "/console/session", `{"code":"`+code+`"}`, map[string]string{"Origin": "http://" + addr})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == ConsoleCookie {
			ck = c
		}
	}
	require.NotNil(t, ck)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	csrf = body[strings.Index(body, `"csrf":"`)+8:]
	csrf = csrf[:strings.Index(csrf, `"`)]
	// A code works once.
	resp, _ = consoleReq(t, addr, "POST", "/console/session", `{"code":"`+code+`"}`, nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	return ConsoleCookie + "=" + ck.Value, csrf
}

func TestConsoleSignInAndCookieAuth(t *testing.T) {
	fb, _, addr := start(t)

	// Minting a code needs the bearer token; a cookie cannot mint one.
	resp, _ := consoleReq(t, addr, "POST", "/console/code", "", nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	for _, body := range []string{`{"code":"nope"}`, `{"code":""}`, `not json`, `{"code":"x","extra":1}`} {
		resp, _ = consoleReq(t, addr, "POST", "/console/session", body, nil)
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusBadRequest}, resp.StatusCode, body)
	}
	ck, csrf := consoleSignedIn(t, addr)
	resp, _ = consoleReq(t, addr, "POST", "/console/code", "", map[string]string{"Cookie": ck, ConsoleCSRFHeader: csrf})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a browser cannot mint codes")

	n := fb.n()
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"nothing", nil, http.StatusUnauthorized},
		{"CSRF header alone", map[string]string{ConsoleCSRFHeader: csrf}, http.StatusUnauthorized},
		{"cookie alone", map[string]string{"Cookie": ck}, http.StatusUnauthorized},
		{"cookie, wrong CSRF", map[string]string{"Cookie": ck, ConsoleCSRFHeader: csrf + "x"}, http.StatusUnauthorized},
		{"forged cookie", map[string]string{"Cookie": ConsoleCookie + "=forged", ConsoleCSRFHeader: csrf}, http.StatusUnauthorized},
		{"wrong Host", map[string]string{"Cookie": ck, ConsoleCSRFHeader: csrf, "Host": "evil.example"}, http.StatusMisdirectedRequest},
		{"wrong bearer beside a good cookie", map[string]string{"Cookie": ck, ConsoleCSRFHeader: csrf, "Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"cookie and CSRF", map[string]string{"Cookie": ck, ConsoleCSRFHeader: csrf}, http.StatusOK},
		{"bearer", map[string]string{"Authorization": "Bearer " + testToken}, http.StatusOK},
	} {
		resp, body := consoleReq(t, addr, "POST", "/v1/ops/list_sandboxes", "{}", tc.hdr)
		require.Equal(t, tc.want, resp.StatusCode, "%s: %s", tc.name, body)
	}
	require.Equal(t, n+2, fb.n(), "only the two authorized requests reached the backend")

	// Another site's page cannot open a terminal: nothing runs.
	n = fb.n()
	resp, _ = consoleReq(t, addr, "GET", "/console/terminal?sandbox_id=eos-1&csrf="+csrf, "", map[string]string{"Cookie": ck,
		"Origin": "http://evil.example", "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, n, fb.n(), "a refused terminal ran nothing")

	// A POST may not pass the CSRF token in the query; a GET stream may.
	resp, _ = consoleReq(t, addr, "POST", "/v1/ops/list_sandboxes?csrf="+csrf, "{}", map[string]string{"Cookie": ck})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	// A reloaded page gets its CSRF token back with the cookie only.
	resp, body := consoleReq(t, addr, "GET", "/console/session", "", map[string]string{"Cookie": ck})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, csrf)

	// Sign-in from another origin is refused before the code is spent.
	resp, body = consoleReq(t, addr, "POST", "/console/code", "", map[string]string{"Authorization": "Bearer " + testToken})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	code := body[strings.Index(body, `"code":"`)+8:]
	code = code[:strings.Index(code, `"`)]
	resp, _ = consoleReq(t, addr, "POST", "/console/session", `{"code":"`+code+`"}`, map[string]string{"Origin": "http://evil.example"})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, _ = consoleReq(t, addr, "POST", "/console/session", `{"code":"`+code+`"}`, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// Signing out ends the cookie.
	resp, _ = consoleReq(t, addr, "DELETE", "/console/session", "", map[string]string{"Cookie": ck, ConsoleCSRFHeader: csrf})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = consoleReq(t, addr, "POST", "/v1/ops/list_sandboxes", "{}", map[string]string{"Cookie": ck, ConsoleCSRFHeader: csrf})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestConsoleCodesExpireAndAreBounded(t *testing.T) {
	a := newConsoleAuth()
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	code, aerr := a.newCode()
	require.Nil(t, aerr)
	now = now.Add(ConsoleCodeTTL)
	_, aerr = a.exchange(code)
	require.NotNil(t, aerr, "an expired code is refused")

	for i := 0; i < maxConsoleCodes; i++ {
		_, aerr = a.newCode()
		require.Nil(t, aerr)
	}
	_, aerr = a.newCode()
	require.NotNil(t, aerr)
	require.Equal(t, "resource_exhausted", aerr.Kind)
	now = now.Add(ConsoleCodeTTL) // they expire, and room is made again
	c, aerr := a.newCode()
	require.Nil(t, aerr)
	tok, aerr := a.exchange(c)
	require.Nil(t, aerr)
	require.True(t, a.valid(tok))
	now = now.Add(ConsoleSessionTTL)
	require.False(t, a.valid(tok), "a session ends after its TTL")
}

func TestConsolePagesCarryCSP(t *testing.T) {
	_, _, addr := start(t)
	resp, body := consoleReq(t, addr, "GET", "/", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, ConsoleCSP, resp.Header.Get("Content-Security-Policy"))
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	require.Contains(t, body, `src="/assets/app.js"`)
	resp, _ = consoleReq(t, addr, "GET", "/assets/app.js", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "javascript")
	require.Equal(t, ConsoleCSP, resp.Header.Get("Content-Security-Policy"))
	for _, p := range []string{"/assets/../embed.go", "/assets/%2e%2e/index.html", "/assets/nope.js"} {
		resp, _ = consoleReq(t, addr, "GET", p, "", nil)
		require.NotEqual(t, http.StatusOK, resp.StatusCode, p)
	}
}

func TestConsoleWatch(t *testing.T) {
	_, _, addr := start(t)
	ck, csrf := consoleSignedIn(t, addr)
	// Only read-only operations can be watched.
	v := func(specs ...string) string {
		q := url.Values{"v": specs}
		return "/console/watch?" + q.Encode()
	}
	for _, bad := range [][]string{
		{`{"op":"destroy_sandbox","args":{"sandbox_id":"eos-1"}}`}, // only read-only operations
		{`{"op":"list_sandboxes","nope":1}`},                       // unknown field
		{`{not json`},
		{`{"op":"snapshot","sandbox_id":"eos-1","args":{"bogus":1}}`}, // validated like any request
		{},
		{`{"op":"health"}`, `{"op":"health"}`, `{"op":"health"}`, `{"op":"health"}`, `{"op":"health"}`, `{"op":"health"}`, `{"op":"health"}`, `{"op":"health"}`, `{"op":"health"}`},
	} {
		resp, body := consoleReq(t, addr, "GET", v(bad...)+"&csrf="+csrf, "", map[string]string{"Cookie": ck})
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%v: %s", bad, body)
	}
	resp, _ := consoleReq(t, addr, "GET", v(`{"op":"list_sandboxes"}`), "", map[string]string{"Cookie": ck})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a stream needs the CSRF token too")

	req, _ := http.NewRequest("GET", "http://"+addr+v(`{"op":"snapshot","sandbox_id":"eos-1"}`, `{"op":"list_sandboxes"}`)+"&csrf="+csrf, nil)
	req.Header.Set("Cookie", ck)
	r, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer r.Body.Close()
	require.Equal(t, "text/event-stream", r.Header.Get("Content-Type"))
	br := bufio.NewReader(r.Body)
	var got []string
	for len(got) < 4 {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "event: ") || strings.HasPrefix(line, "data: ") {
			got = append(got, strings.TrimSpace(line))
		}
	}
	require.Equal(t, []string{"event: view", `data: {"i":0,"result":{"status":"ok","op":"snapshot"}}`,
		"event: view", `data: {"i":1,"result":{"op":"list_sandboxes","sandbox_id":"","via":"lifecycle"}}`}, got)
}
