package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/ephemeral-sandbox/sandbox/internal/testenv"
)

// The console's browser tests run a real Chromium (Debian's chromium
// package; scripts/ensure-chromium.sh installs it, `make test` runs that)
// against the real stack: the gateway binary with its embedded Temporal and
// workers, Docker, a sandbox daemon, and the CLIs driving two sessions.
// EOS_SKIP_BROWSER=1 skips them (local development only; CI installs the
// browser). EOS_CONSOLE_SCREENSHOTS=DIR keeps the screenshots there
// (default: the test's temp dir).

// chromiumPath finds the system browser; it never downloads one.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if os.Getenv("EOS_SKIP_BROWSER") == "1" {
		t.Skip("EOS_SKIP_BROWSER=1")
	}
	for _, p := range []string{os.Getenv("EOS_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("no chromium: run scripts/ensure-chromium.sh (or set EOS_SKIP_BROWSER=1 to skip the browser tests locally)")
	return ""
}

// browser starts a headless Chromium with a fresh profile, the flags this
// closed network needs, and returns its context.
func browser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(acancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// page drives one browser tab; every wait is bounded (a bound, not a
// timed assertion: it only turns a hang into a failure).
type page struct {
	t     *testing.T
	ctx   context.Context
	base  string
	shots string
}

const pageWait = 90 * time.Second

func (p *page) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, pageWait)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		ectx, ecancel := context.WithTimeout(p.ctx, 10*time.Second)
		defer ecancel()
		body, _ := chromedp.Run(ectx, chromedp.Evaluate[string]("document.body.innerText"))
		p.t.Fatalf("%s: %v\npage text:\n%s", what, err, body)
	}
}

// until waits for a JavaScript condition to hold.
func (p *page) until(what, js string) {
	p.t.Helper()
	p.run(what, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(pageWait))(ctx, t)
		return err
	}))
}

func (p *page) location() string {
	p.t.Helper()
	loc, err := chromedp.Run(p.ctx, chromedp.Location())
	if err != nil {
		p.t.Fatal(err)
	}
	return loc
}

// hasText is a JS condition: an element matching sel contains text.
func hasText(sel, text string) string {
	s, _ := json.Marshal(sel)
	x, _ := json.Marshal(text)
	return fmt.Sprintf(`[...document.querySelectorAll(%s)].some(e => e.textContent.includes(%s))`, s, x)
}

func (p *page) open(hash string) {
	p.t.Helper()
	p.run("open "+hash, chromedp.Navigate(p.base+"/"+hash))
}

func colorScheme(s string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: s}}})
		return err
	})
}

// shoot writes a screenshot of the page at each width.
func (p *page) shoot(name string, dark bool) {
	p.t.Helper()
	scheme := "light"
	if dark {
		scheme = "dark"
	}
	for _, w := range []int64{390, 1024, 1440} {
		p.run("viewport", colorScheme(scheme), chromedp.EmulateViewport(w, 900),
			chromedp.Sleep(300*time.Millisecond)) // layout settles; not an assertion
		buf, err := chromedp.Run(p.ctx, chromedp.CaptureScreenshot())
		if err != nil {
			p.t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(p.shots, fmt.Sprintf("%s-%d.png", name, w)), buf, 0o644); err != nil {
			p.t.Fatal(err)
		}
	}
	p.run("viewport", chromedp.EmulateViewport(1440, 1000), colorScheme("light"))
}

// consoleURL runs `sandbox-manager-cli console --no-open` and returns the
// sign-in URL it prints.
func consoleURL(t *testing.T, g *gatewayProc) string {
	t.Helper()
	out := mustCLI(t, g, "sandbox-manager-cli", "console", "--no-open")
	u, _ := out["url"].(string)
	if !strings.HasPrefix(u, "http://"+g.Addr+"/#login=") || out["opened"] != false {
		t.Fatalf("console: %v", out)
	}
	return u
}

// rawHTTP sends one request with the given headers and returns status and body.
func rawHTTP(t *testing.T, g *gatewayProc, method, path, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+g.Addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestConsoleInBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	g := startGatewayProcess(t)
	shots := os.Getenv("EOS_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	base := "http://" + g.Addr
	ctx := browser(t, chromium)
	p := &page{t: t, ctx: ctx, base: base, shots: shots}

	// The page itself carries a strict CSP.
	st, _ := rawHTTP(t, g, "GET", "/", "", nil)
	if st != http.StatusOK {
		t.Fatalf("GET /: %d", st)
	}
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("CSP: %q", csp)
	}

	// Signed out, the page says how to sign in; a wrong code is refused.
	p.open("#login=not-a-code")
	p.until("wrong code refused", hasText("#signin-message", "Sign-in refused"))

	// The CLI's one-time code signs the browser in.
	u := consoleURL(t, g)
	code := u[strings.Index(u, "#login=")+len("#login="):]
	p.run("sign in", chromedp.Navigate(u))
	p.until("fleet page", `document.querySelector('main[data-page="fleet"]') !== null && document.querySelector('#create-submit') !== null`)
	if loc := p.location(); strings.Contains(loc, code) {
		t.Fatalf("the code stayed in the URL: %s", loc)
	}
	// The same code again is refused: in the browser (which stays signed in
	// with its cookie) and over HTTP.
	p.run("reuse the code", chromedp.Navigate(u))
	p.until("reused code refused", hasText("#notice", "Sign-in refused")+` && document.querySelector('main[data-page="fleet"]') !== null`)
	p.run("dismiss the notice", chromedp.Click(chromedp.CSS("#notice button")))
	p.until("notice gone", `document.querySelector('#notice') === null`)
	if st, body := rawHTTP(t, g, "POST", "/console/session", fmt.Sprintf(`{"code":%q}`, code), map[string]string{"Content-Type": "application/json"}); st != http.StatusUnauthorized {
		t.Fatalf("reused code: %d %s", st, body)
	}

	// The cookie: HttpOnly, SameSite=Strict; it alone is not enough.
	var cookie *network.Cookie
	cs, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs.Cookies {
		if c.Name == "eos_console" {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HTTPOnly || cookie.SameSite != network.CookieSameSiteStrict {
		t.Fatalf("console cookie: %+v", cookie)
	}
	ck := "eos_console=" + cookie.Value
	if st, body := rawHTTP(t, g, "POST", "/v1/ops/list_sandboxes", "{}", nil); st != http.StatusUnauthorized {
		t.Fatalf("no cookie: %d %s", st, body)
	}
	if st, body := rawHTTP(t, g, "POST", "/v1/ops/list_sandboxes", "{}", map[string]string{"Cookie": ck}); st != http.StatusUnauthorized || !strings.Contains(body, "X-EOS-CSRF") {
		t.Fatalf("cookie without CSRF: %d %s", st, body)
	}
	if st, body := rawHTTP(t, g, "POST", "/v1/ops/list_sandboxes", "{}", map[string]string{"Cookie": ck, "X-EOS-CSRF": "wrong"}); st != http.StatusUnauthorized {
		t.Fatalf("cookie with a wrong CSRF token: %d %s", st, body)
	}
	st, body := rawHTTP(t, g, "GET", "/console/session", "", map[string]string{"Cookie": ck})
	var sess struct{ CSRF string }
	if st != http.StatusOK || json.Unmarshal([]byte(body), &sess) != nil || sess.CSRF == "" {
		t.Fatalf("GET /console/session: %d %s", st, body)
	}
	good := map[string]string{"Cookie": ck, "X-EOS-CSRF": sess.CSRF}
	if st, body := rawHTTP(t, g, "POST", "/v1/ops/list_sandboxes", "{}", good); st != http.StatusOK {
		t.Fatalf("cookie and CSRF: %d %s", st, body)
	}
	evil := map[string]string{"Cookie": ck, "X-EOS-CSRF": sess.CSRF, "Host": "evil.example:" + strings.Split(g.Addr, ":")[1]}
	for _, path := range []string{"/", "/v1/ops/list_sandboxes", "/console/session"} {
		if st, _ := rawHTTP(t, g, "POST", path, "{}", evil); st != http.StatusMisdirectedRequest {
			t.Fatalf("wrong Host on %s: %d", path, st)
		}
	}
	// A stream without the CSRF token, a terminal from another origin.
	if st, _ := rawHTTP(t, g, "GET", "/console/watch?v=%7B%22op%22%3A%22list_sandboxes%22%7D", "", map[string]string{"Cookie": ck}); st != http.StatusUnauthorized {
		t.Fatalf("watch without CSRF: %d", st)
	}
	if st, _ := rawHTTP(t, g, "GET", "/console/watch?v=%7B%22op%22%3A%22destroy_sandbox%22%7D&csrf="+sess.CSRF, "", map[string]string{"Cookie": ck}); st != http.StatusBadRequest {
		t.Fatalf("watching a mutating op: %d", st)
	}
	{
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, wresp, err := websocket.Dial(wctx, "ws://"+g.Addr+"/console/terminal?sandbox_id=eos-x&csrf="+sess.CSRF,
			&websocket.DialOptions{HTTPHeader: http.Header{"Cookie": {ck}, "Origin": {"http://evil.example"}}})
		wcancel()
		if err == nil || wresp == nil || wresp.StatusCode == http.StatusSwitchingProtocols {
			t.Fatalf("terminal from another origin: %v %v", err, wresp)
		}
	}
	// The bearer token keeps working beside the cookie.
	if st, body := rawHTTP(t, g, "POST", "/v1/ops/list_sandboxes", "{}", map[string]string{"Authorization": "Bearer " + g.Token}); st != http.StatusOK {
		t.Fatalf("bearer: %d %s", st, body)
	}

	// Keyboard: Tab from the top of the page reaches the create form.
	p.run("blur", chromedp.Evaluate[chromedp.Void]("document.activeElement && document.activeElement.blur()"))
	reached := false
	for i := 0; i < 12 && !reached; i++ {
		p.run("tab", chromedp.KeyEvent("\t"))
		id, err := chromedp.Run(p.ctx, chromedp.Evaluate[string]("document.activeElement ? document.activeElement.id : ''"))
		if err != nil {
			t.Fatal(err)
		}
		reached = id == "create-root"
	}
	if !reached {
		t.Fatal("Tab never reached the workspace folder field")
	}

	// Create a sandbox from the Fleet page: a local image, a workspace folder.
	ws := filepath.Join(testenv.TempRoot(t), fmt.Sprintf("console-ws-%d", time.Now().UnixNano()))
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ws) })
	writeFile(t, filepath.Join(ws, "b.txt"), "l1\nl2\nl3\n")
	writeFile(t, filepath.Join(ws, "README.md"), "# demo\n")
	p.until("images listed", `[...document.querySelectorAll('#create-image option')].some(o => o.value === 'eos-test-debian:1')`)
	p.run("create form",
		chromedp.SetValue(chromedp.ID("create-image"), "eos-test-debian:1"),
		chromedp.Focus(chromedp.ID("create-root")),
		chromedp.SendKeys(chromedp.ID("create-root"), ws),
		chromedp.Click(chromedp.ID("create-submit")))
	p.until("sandbox page", `location.hash.startsWith('#/sandbox/eos-')`)
	loc := p.location()
	id := loc[strings.Index(loc, "#/sandbox/")+len("#/sandbox/"):]
	cleanupSandbox(t, id)
	p.until("ready", hasText(".page-head .badge", "ready"))

	// Two sessions the CLI drives appear.
	rt := func(argv ...string) map[string]any {
		return mustCLI(t, g, "sandbox-runtime-cli", append([]string{"--sandbox-id", id}, argv...)...)
	}
	ws1 := rt("create_workspace_session", "--agent", "alice")["workspace_session_id"].(string)
	ws2 := rt("create_workspace_session", "--agent", "bob")["workspace_session_id"].(string)
	p.until("both sessions listed", fmt.Sprintf(`document.querySelector('tr[data-session=%q]') && document.querySelector('tr[data-session=%q]')`, ws1, ws2))
	p.until("agents shown", hasText(fmt.Sprintf("tr[data-session=%q]", ws2), "bob"))

	// A command's output arrives while it runs: it prints, then waits for a
	// flag file only the test writes after the page showed the line.
	out := rt("exec_command", "--workspace-session-id", ws1, "--yield-time-ms", "0",
		"echo first-line-from-alice; while [ ! -f go.flag ]; do sleep 0.2; done; echo second-line-after-flag")
	cmdID := out["command_session_id"].(string)
	p.until("live output", hasText(fmt.Sprintf("div[data-command=%q] pre", cmdID), "first-line-from-alice"))
	if st := rt("read_command_lines", "--command-session-id", cmdID)["status"]; st != "running" {
		t.Fatalf("the command should still be waiting for its flag, status %v", st)
	}
	rt("file_write", "--workspace-session-id", ws1, "--path", "go.flag", "--content", "go")
	p.until("output after the flag", hasText(fmt.Sprintf("div[data-command=%q] pre", cmdID), "second-line-after-flag"))
	p.until("command ended", hasText(fmt.Sprintf("div[data-command=%q] .badge", cmdID), "ok"))

	// Both change line 2 of b.txt; alice publishes first, bob conflicts.
	rt("file_write", "--workspace-session-id", ws1, "--path", "b.txt", "--content", "l1\nALICE\nl3\n")
	rt("file_write", "--workspace-session-id", ws2, "--path", "b.txt", "--content", "l1\nBOB\nl3\n")
	rt("publish_workspace_session", "--workspace-session-id", ws1)
	if r := runCLI(t, g, "sandbox-runtime-cli", "--sandbox-id", id, "publish_workspace_session", "--workspace-session-id", ws2); r.code != 1 {
		t.Fatalf("bob's publish should conflict: %d %s", r.code, r.stderr)
	}
	p.until("clean publish listed", `document.querySelector('li[data-outcome="clean"]') !== null`)
	p.until("alice's layer on the timeline", hasText("ol.timeline", "alice"))
	conflict := `li[data-outcome="conflict"] div[data-conflict-path="b.txt"]`
	p.until("conflict path", fmt.Sprintf(`document.querySelector(%q) !== null`, conflict))
	for _, col := range []string{"line 2"} {
		p.until("conflict line ranges", fmt.Sprintf(`(() => { const c = document.querySelector(%q); if (!c) return false;
			const cells = [...c.querySelectorAll('table.hunks td')].map(td => td.textContent);
			return cells.length === 3 && cells.every(x => x === %q); })()`, conflict, col))
	}
	p.shoot("sandbox", false)
	p.shoot("sandbox-dark", true)

	// Files: the published head, bob's unpublished diff, blame.
	p.open(fmt.Sprintf("#/files/%s?path=b.txt", id))
	p.until("head content", hasText("table.code", "ALICE"))
	p.shoot("files", false)
	p.open(fmt.Sprintf("#/files/%s?ws=%s&mode=diff", id, ws2))
	p.until("bob's diff", hasText("pre.diff .d-add", "+BOB"))
	p.shoot("diff", false)
	p.open(fmt.Sprintf("#/files/%s?path=b.txt&mode=blame", id))
	p.until("blame", hasText("table.code td.owner", "workspace_session:"+ws1))

	// Terminal: an interactive shell in bob's session.
	p.open(fmt.Sprintf("#/terminal/%s?ws=%s", id, ws2))
	p.until("terminal connected", hasText(".page-head .badge", "connected"))
	p.run("type a command", chromedp.SendKeys(chromedp.ID("terminal-input"), "echo $((6*7))-from-the-pty; cat b.txt\n"))
	p.until("command output", hasText("#terminal-screen", "42-from-the-pty"))
	p.until("session's file", hasText("#terminal-screen", "BOB"))
	p.run("type stty", chromedp.SendKeys(chromedp.ID("terminal-input"), "stty size\n"))
	p.until("a window size", `/\n\d+ \d+\n/.test(document.querySelector('#terminal-screen').textContent)`)
	p.shoot("terminal", false)

	// Health: Temporal, Docker and this sandbox's daemon.
	p.open("#/health")
	p.until("health", hasText(`div[data-check="temporal"]`, "ok")+" && "+hasText(`div[data-check="docker"]`, "ok")+
		fmt.Sprintf(` && document.querySelector('li[data-daemon=%q]') !== null`, id))
	p.until("metrics", hasText("#ops", "publish_workspace_session"))
	p.until("operations per second", hasText("#ops .spark-val", "ops/s"))
	p.shoot("health", false)

	// Fleet: the sandbox with its sessions; then destroy it from the page.
	p.open("#/")
	p.until("fleet row", fmt.Sprintf(`document.querySelector('tr[data-sandbox=%q]') !== null`, id))
	p.shoot("fleet", false)
	p.shoot("fleet-dark", true)
	btn := fmt.Sprintf(`button[data-destroy=%q]`, id)
	p.run("destroy", chromedp.Click(chromedp.CSS(btn)))
	p.until("armed", hasText(btn, "Confirm destroy"))
	p.run("confirm", chromedp.Click(chromedp.CSS(btn)))
	p.until("row gone", fmt.Sprintf(`document.querySelector('tr[data-sandbox=%q]') === null`, id))
	list := mustCLI(t, g, "sandbox-manager-cli", "list_sandboxes")
	if b, _ := json.Marshal(list); bytes.Contains(b, []byte(id)) {
		t.Fatalf("destroyed sandbox still listed: %s", b)
	}
	t.Logf("screenshots in %s", shots)
}
