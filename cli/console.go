package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
)

// consoleCommand is `sandbox-manager-cli console`: it asks the gateway for
// a one-time sign-in code (with the bearer token) and prints the URL that
// signs a browser in to the operator console; at a desktop it opens it.
func consoleCommand(g *globals, stdout io.Writer) *cobra.Command {
	var noOpen bool
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Open the operator console (prints a one-time sign-in URL)",
		Long: "Asks the gateway for a one-time sign-in code and prints {\"url\":...}: opening the URL signs the browser in " +
			"(an HttpOnly, SameSite=Strict cookie); the code works once and expires after 2 minutes. At a desktop " +
			"($DISPLAY, $WAYLAND_DISPLAY or macOS) the URL is also opened in the default browser unless --no-open.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			c, err := newClient(g)
			if err != nil {
				return err
			}
			base, err := consoleBase(c.Endpoint)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/console/code", nil)
			req.Header.Set("Authorization", "Bearer "+c.Token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return &exitError{code: ExitError, err: api.Errorf(client.KindConnection, nil, "connect to gateway %s: %v", base, err)}
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if resp.StatusCode != http.StatusOK {
				var env api.Envelope
				if json.Unmarshal(body, &env) == nil && env.Error != nil {
					return &exitError{code: ExitError, err: env.Error}
				}
				return &exitError{code: ExitError, err: api.Errorf(client.KindProtocol, nil, "gateway answered %s", resp.Status)}
			}
			var out struct {
				URL     string `json:"url"`
				Expires int    `json:"expires_in_s"`
			}
			if err := json.Unmarshal(body, &out); err != nil || out.URL == "" {
				return &exitError{code: ExitError, err: api.Errorf(client.KindProtocol, nil, "bad response: %q", body)}
			}
			opened := false
			if !noOpen {
				opened = openBrowser(out.URL)
			}
			b, _ := json.Marshal(map[string]any{"url": out.URL, "expires_in_s": out.Expires, "opened": opened})
			fmt.Fprintln(stdout, string(b))
			return nil
		},
	}
	cmd.Flags().BoolVar(&noOpen, "no-open", false, "only print the URL, never start a browser")
	return cmd
}

// consoleBase is the gateway's HTTP base URL from a CLI endpoint; the
// console needs TCP (a browser cannot reach a unix socket).
func consoleBase(ep string) (string, error) {
	switch {
	case strings.HasPrefix(ep, "http://"):
		return strings.TrimRight(ep, "/"), nil
	case strings.HasPrefix(ep, "tcp://"):
		return "http://" + strings.TrimPrefix(ep, "tcp://"), nil
	case strings.HasPrefix(ep, "unix://"), strings.HasPrefix(ep, "/"), strings.Contains(ep, "://"):
		return "", usage("the console needs the gateway's TCP address (--gateway-endpoint 127.0.0.1:7878), not %s", ep)
	}
	return "http://" + ep, nil
}

// openBrowser starts the desktop's URL opener, if there is a desktop.
func openBrowser(url string) bool {
	var name string
	switch {
	case runtime.GOOS == "darwin":
		name = "open"
	case os.Getenv("DISPLAY") != "" || os.Getenv("WAYLAND_DISPLAY") != "":
		name = "xdg-open"
	default:
		return false
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return false
	}
	cmd := exec.Command(path, url)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return false
	}
	go func() { _ = cmd.Wait() }()
	return true
}
