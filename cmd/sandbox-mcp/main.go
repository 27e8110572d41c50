// Command sandbox-mcp is the MCP server of Ephemeral Sandbox over stdio:
// one tool group per process (--set management|runtime|observability), a
// client of the gateway like the CLIs. `sandbox-mcp setup codex|claude`
// registers the three servers with Codex or Claude Code.
//
// Nothing but MCP protocol is written to stdout; logs go to stderr.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	mcpserver "github.com/mark3labs/mcp-go/server"
	"github.com/spf13/cobra"

	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/mcp"
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

type serveOptions struct {
	set       string
	endpoint  string
	token     string
	tokenFile string
	logLevel  string
}

func run(argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(stdin, stdout, stderr)
	root.SetArgs(argv)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(stderr, "sandbox-mcp:", err)
		return 2
	}
	return 0
}

func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	o := &serveOptions{}
	root := &cobra.Command{
		Use:   "sandbox-mcp --set management|runtime|observability [--gateway-endpoint URI] [--gateway-auth-token TOKEN]",
		Short: "MCP server (stdio) for one Ephemeral Sandbox tool group",
		Long: "sandbox-mcp serves one tool group over stdio: management (sandboxes), runtime (sessions, commands, files, " +
			"publish; every tool takes sandbox_id) or observability (read-only views). It is a client of sandbox-gateway: " +
			"the endpoint comes from --gateway-endpoint, SANDBOX_GATEWAY_SOCKET or 127.0.0.1:7878, the token from " +
			"--gateway-auth-token, SANDBOX_GATEWAY_AUTH_TOKEN or the token file.\n\n" +
			"Register the three servers with a client: sandbox-mcp setup codex | sandbox-mcp setup claude (--dry-run to preview).",
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serveStdio(cmd.Context(), o, stdin, stdout, stderr)
		},
	}
	root.SetIn(stdin)
	root.SetOut(stderr) // help and usage never touch the protocol stream
	root.SetErr(stderr)
	root.CompletionOptions.DisableDefaultCmd = true
	f := root.Flags()
	f.StringVar(&o.set, "set", "", "tool group to serve: management, runtime or observability")
	pf := root.PersistentFlags()
	pf.StringVar(&o.endpoint, "gateway-endpoint", "", "gateway endpoint: host:port, tcp://host:port, unix:///path or http://host:port")
	pf.StringVar(&o.token, "gateway-auth-token", "", "gateway token (default: SANDBOX_GATEWAY_AUTH_TOKEN, else the token file)")
	pf.StringVar(&o.tokenFile, "gateway-token-file", "", "gateway token file (default "+client.TokenPath()+")")
	f.StringVar(&o.logLevel, "log-level", "info", "stderr log level: debug, info, warn, error")
	root.AddCommand(newSetupCmd(o, stdout))
	return root
}

func serveStdio(ctx context.Context, o *serveOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	if !mcp.ValidSet(o.set) {
		return fmt.Errorf("--set must be management, runtime or observability (got %q)", o.set)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	token := o.token
	if token == "" && o.tokenFile != "" {
		// An explicit token file is what the user meant: it must be there
		// and it wins over SANDBOX_GATEWAY_AUTH_TOKEN.
		t, err := client.ReadToken(o.tokenFile)
		if err != nil {
			return fmt.Errorf("--gateway-token-file: %w", err)
		}
		token = t
	}
	c, err := client.Resolve(o.endpoint, token)
	if err != nil {
		return fmt.Errorf("gateway token: %w", err)
	}
	srv, err := mcp.NewServer(o.set, c, mcp.Options{Log: logger})
	if err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger.Info("sandbox-mcp serving on stdio", "set", o.set, "gateway", c.Endpoint)
	s := mcpserver.NewStdioServer(srv)
	s.SetErrorLogger(log.New(stderr, "sandbox-mcp: ", log.LstdFlags))
	if err := s.Listen(ctx, stdin, stdout); err != nil && ctx.Err() == nil && err != io.EOF {
		return err
	}
	return nil
}

func newSetupCmd(o *serveOptions, stdout io.Writer) *cobra.Command {
	var so mcp.SetupOptions
	cmd := &cobra.Command{
		Use:   "setup codex|claude [--dry-run] [--config FILE] [--binary PATH]",
		Short: "Register the management, runtime and observability servers with Codex or Claude Code",
		Long: "Writes the MCP configuration of Codex ($CODEX_HOME/config.toml or ~/.codex/config.toml: [mcp_servers.ephemeral-os-*]) " +
			"or Claude Code (~/.claude.json, or ./.mcp.json with --scope project: mcpServers.ephemeral-os-*). Other settings in the " +
			"file are kept; running it again changes nothing. The token is not written: the servers read it from the token file.",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{mcp.ClientCodex, mcp.ClientClaude},
		RunE: func(cmd *cobra.Command, args []string) error {
			so.Client = args[0]
			so.Endpoint, so.TokenFile = o.endpoint, o.tokenFile
			if o.token != "" {
				return fmt.Errorf("setup does not write tokens into client configuration; use --gateway-token-file or the default token file")
			}
			if so.Binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				if exe, err = filepath.EvalSymlinks(exe); err != nil {
					return err
				}
				so.Binary = exe
			}
			if so.TokenFile != "" && !filepath.IsAbs(so.TokenFile) {
				abs, err := filepath.Abs(so.TokenFile)
				if err != nil {
					return err
				}
				so.TokenFile = abs
			}
			res, err := mcp.Setup(so)
			if err != nil {
				return err
			}
			switch {
			case so.DryRun:
				fmt.Fprintf(stdout, "# dry run: would write %s (changed: %v)\n%s", res.Path, res.Changed, res.Content)
			case res.Changed:
				fmt.Fprintf(stdout, "registered %v in %s\n", res.Servers, res.Path)
			default:
				fmt.Fprintf(stdout, "%v already registered in %s; nothing changed\n", res.Servers, res.Path)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&so.DryRun, "dry-run", false, "print the file that would be written, write nothing")
	f.StringVar(&so.Config, "config", "", "configuration file to write (default: the client's own)")
	f.StringVar(&so.Binary, "binary", "", "absolute path of sandbox-mcp for the client to launch (default: this binary)")
	f.StringVar(&so.Scope, "scope", "user", "claude: user (~/.claude.json) or project (./.mcp.json)")
	return cmd
}
