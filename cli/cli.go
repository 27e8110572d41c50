// Package cli projects the operation catalog onto the seed's three CLIs:
// sandbox-manager-cli (management), sandbox-runtime-cli (runtime) and
// sandbox-observability-cli (observability).
//
// Syntax: BIN [globals] OPERATION [--flag value]... [POSITIONAL]. Success
// prints one JSON line on stdout (exit 0; on a terminal, list results print
// as a table unless --json); an operation error prints the
// error envelope on stderr (exit 1); usage errors print an invalid_request
// envelope on stderr (exit 2).
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/api/client"
	"github.com/ephemeral-sandbox/sandbox/api/jsonl"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1 // the operation failed (or the gateway was unreachable)
	ExitUsage = 2 // nothing was sent
)

// KindConfig is the CLI-local error kind for configuration problems.
const KindConfig = "config_error"

// BinaryName returns the seed's binary name of a group.
func BinaryName(group string) string {
	switch group {
	case api.GroupManagement:
		return "sandbox-manager-cli"
	case api.GroupRuntime:
		return "sandbox-runtime-cli"
	case api.GroupObservability:
		return "sandbox-observability-cli"
	}
	return "sandbox-" + group + "-cli"
}

// exitError carries an exit code and the envelope to print on stderr.
type exitError struct {
	code int
	err  *api.Error
}

func (e *exitError) Error() string { return e.err.Error() }

func usage(format string, a ...any) error {
	return &exitError{code: ExitUsage, err: api.Errorf(api.KindInvalidRequest, nil, format, a...)}
}

type globals struct {
	endpoint  string
	token     string
	requestID string
	sandboxID string
	progress  bool
	json      bool
}

var requestIDRe = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// Main runs the CLI of a group and returns the process exit code.
func Main(group string, argv []string, stdout, stderr io.Writer) int {
	root := NewCommand(group, stdout, stderr)
	root.SetArgs(argv)
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = &exitError{code: ExitUsage, err: api.Errorf(api.KindInvalidRequest, nil, "%s", err.Error())}
	}
	b, _ := json.Marshal(api.Envelope{Error: ee.err})
	fmt.Fprintln(stderr, string(b))
	return ee.code
}

// NewCommand builds the cobra tree of a group from the catalog.
func NewCommand(group string, stdout, stderr io.Writer) *cobra.Command {
	g := &globals{}
	bin := BinaryName(group)
	root := &cobra.Command{
		Use:           bin + " [globals] OPERATION [--flag value]... [POSITIONAL]",
		Short:         "Ephemeral Sandbox " + group + " operations",
		Long:          groupLong(group),
		SilenceErrors: true,
		SilenceUsage:  true,
		Run:           func(cmd *cobra.Command, _ []string) { _ = cmd.Help() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage("%v", err) })
	pf := root.PersistentFlags()
	pf.StringVar(&g.endpoint, "gateway-endpoint", "", "gateway endpoint: host:port, tcp://host:port, unix:///path or http://host:port (env SANDBOX_GATEWAY_SOCKET, default "+client.DefaultEndpoint+")")
	pf.StringVar(&g.endpoint, "gateway-socket", "", "alias of --gateway-endpoint")
	_ = pf.MarkHidden("gateway-socket")
	pf.StringVar(&g.token, "gateway-auth-token", "", "gateway token (env SANDBOX_GATEWAY_AUTH_TOKEN, else the token file "+client.TokenPath()+")")
	pf.StringVar(&g.requestID, "request-id", "", "request id (1-128 chars of [A-Za-z0-9._:-]); it is the trace id")
	pf.BoolVar(&g.json, "json", false, "always print the JSON line (the default unless stdout is a terminal and the result is a list, which prints a table)")
	switch group {
	case api.GroupManagement:
		pf.BoolVar(&g.progress, "progress", false, "create_sandbox: stream progress messages to stderr (the gateway's cli_log frames)")
	case api.GroupRuntime:
		pf.StringVar(&g.sandboxID, "sandbox-id", "", "sandbox to operate on (required)")
	case api.GroupObservability:
		pf.StringVar(&g.sandboxID, "sandbox-id", "", "sandbox to observe; without it, system (fleet) scope")
	}
	for _, op := range api.PublicOps(group) {
		root.AddCommand(opCommand(group, op, g, stdout, stderr))
	}
	if group == api.GroupManagement {
		root.AddCommand(consoleCommand(g, stdout))
	}
	return root
}

func groupLong(group string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: the %s operations of Ephemeral Sandbox, sent to the gateway.\n\n", BinaryName(group), group)
	b.WriteString("Success prints one JSON line on stdout (exit 0); when stdout is a terminal, a result listing sandboxes, workspace_sessions, entries or matches prints as a table instead (--json keeps the JSON line). Errors print {\"error\":{kind,message,details}} on stderr: exit 1 when the operation failed, 2 when nothing was sent.\n")
	b.WriteString("Run `" + BinaryName(group) + " help OPERATION` for an operation's arguments.")
	return b.String()
}

// argValue is a pflag.Value typed by a catalog arg; it refuses duplicates.
type argValue struct {
	arg   api.Arg
	set   bool
	value any
}

func (v *argValue) String() string {
	if v.arg.Default == nil {
		return ""
	}
	return fmt.Sprint(v.arg.Default)
}

func (v *argValue) Type() string {
	switch v.arg.Type {
	case api.TypeInt:
		return "int"
	case api.TypeBool:
		return "bool"
	case api.TypeObject, api.TypeArray:
		return "json"
	case api.TypeStringOrList:
		return "string|json"
	}
	return "string"
}

func (v *argValue) Set(s string) error {
	if v.set {
		return fmt.Errorf("duplicate flag --%s", kebab(v.arg.Name))
	}
	x, err := parseArg(v.arg, s)
	if err != nil {
		return err
	}
	v.set, v.value = true, x
	return nil
}

func parseArg(a api.Arg, s string) (any, error) {
	switch a.Type {
	case api.TypeInt:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("not an integer: %q", s)
		}
		return n, nil
	case api.TypeBool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("not a boolean: %q", s)
		}
		return b, nil
	case api.TypeObject, api.TypeArray:
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		var x any
		if err := dec.Decode(&x); err != nil {
			return nil, fmt.Errorf("not valid JSON: %v", err)
		}
		x = normalizeNumbers(x)
		if _, ok := x.([]any); a.Type == api.TypeArray && !ok {
			return nil, fmt.Errorf("must be a JSON array")
		}
		if _, ok := x.(map[string]any); a.Type == api.TypeObject && !ok {
			return nil, fmt.Errorf("must be a JSON object")
		}
		return x, nil
	case api.TypeStringOrList:
		if strings.HasPrefix(strings.TrimSpace(s), "[") {
			var x []any
			if err := json.Unmarshal([]byte(s), &x); err != nil {
				return nil, fmt.Errorf("not a valid JSON array: %v", err)
			}
			return x, nil
		}
	}
	return s, nil
}

// normalizeNumbers turns json.Number into int64 or float64.
func normalizeNumbers(x any) any {
	switch v := x.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case []any:
		for i := range v {
			v[i] = normalizeNumbers(v[i])
		}
	case map[string]any:
		for k := range v {
			v[k] = normalizeNumbers(v[k])
		}
	}
	return x
}

func kebab(s string) string { return strings.ReplaceAll(s, "_", "-") }

func opLong(op api.Operation) string {
	var b strings.Builder
	b.WriteString(op.Summary + "\n\n" + op.Description + "\n")
	if len(op.Args) > 0 {
		b.WriteString("\nArguments:\n")
		for _, a := range op.Args {
			req := ""
			if a.Required {
				req = " (required)"
			}
			pos := ""
			if a.Positional {
				pos = " [also positional]"
			}
			fmt.Fprintf(&b, "  --%s %s%s%s: %s", kebab(a.Name), a.Type, req, pos, a.Description)
			if a.Default != nil {
				fmt.Fprintf(&b, " Default %v.", a.Default)
			}
			if a.Min != nil || a.Max != nil {
				lo, hi := "", ""
				if a.Min != nil {
					lo = strconv.FormatInt(*a.Min, 10)
				}
				if a.Max != nil {
					hi = strconv.FormatInt(*a.Max, 10)
				}
				fmt.Fprintf(&b, " Range %s..%s.", lo, hi)
			}
			if len(a.Enum) > 0 {
				fmt.Fprintf(&b, " One of %s.", strings.Join(a.Enum, "|"))
			}
			b.WriteString("\n")
		}
	}
	if op.CLIUpload != "" {
		fmt.Fprintf(&b, "  --from LOCALFILE: send this local file's bytes as --%s.\n", kebab(op.CLIUpload))
	}
	if op.CLIDownload != "" {
		fmt.Fprintf(&b, "  --to LOCALFILE: write the bytes of %s to this local file (the JSON line then omits them); --force replaces an existing one.\n", op.CLIDownload)
	}
	if len(op.Result) > 0 {
		keys := make([]string, 0, len(op.Result))
		for k := range op.Result {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString("\nResult fields: " + strings.Join(keys, ", ") + "\n")
	}
	return b.String()
}

func opCommand(group string, op api.Operation, g *globals, stdout, stderr io.Writer) *cobra.Command {
	values := map[string]*argValue{}
	cmd := &cobra.Command{
		Use:   op.Name,
		Short: op.Summary,
		Long:  opLong(op),
	}
	pos, hasPos := op.PositionalArg()
	if hasPos {
		cmd.Use += " [" + strings.ToUpper(pos.Name) + "]"
		cmd.Args = func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usage("%s takes at most one positional argument (%s); quote it", op.Name, pos.Name)
			}
			return nil
		}
	} else {
		cmd.Args = func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usage("%s takes no positional arguments, got %q", op.Name, args[0])
			}
			return nil
		}
	}
	fs := cmd.Flags()
	for _, a := range op.Args {
		v := &argValue{arg: a}
		values[a.Name] = v
		f := fs.VarPF(v, kebab(a.Name), "", a.Description)
		if a.Type == api.TypeBool {
			f.NoOptDefVal = "true"
		}
		for _, alias := range a.Aliases {
			af := fs.VarPF(v, alias, "", "alias of --"+kebab(a.Name))
			if a.Type == api.TypeBool {
				af.NoOptDefVal = "true"
			}
		}
	}
	lf := addLocalFileFlags(op, fs)
	cmd.RunE = func(cmd *cobra.Command, posArgs []string) error {
		if err := lf.fill(op, values); err != nil {
			return err
		}
		if err := lf.check(); err != nil {
			return err
		}
		args, err := buildArgs(op, values, posArgs)
		if err != nil {
			return err
		}
		scope, err := resolveScope(group, op, g)
		if err != nil {
			return err
		}
		if g.requestID != "" && !requestIDRe.MatchString(g.requestID) {
			return usage("--request-id must be 1-128 characters of [A-Za-z0-9._:-]")
		}
		if verr := op.Validate(args); verr != nil {
			return &exitError{code: ExitUsage, err: verr}
		}
		c, err := newClient(g)
		if err != nil {
			return err
		}
		var progress func(string)
		var pl *progressLine
		if g.progress && op.Name == "create_sandbox" {
			pl = &progressLine{w: stderr, tty: isTerminal(stderr)}
			progress = pl.show
		}
		out, cerr := c.CallProgress(context.Background(), op.Name, scope, args, g.requestID, progress)
		pl.end()
		if cerr != nil {
			return &exitError{code: ExitError, err: api.AsError(cerr)}
		}
		if out, err = lf.write(op, out); err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, out); err != nil {
			return &exitError{code: ExitError, err: api.Errorf(client.KindProtocol, nil, "bad response: %v", err)}
		}
		if !g.json && isTerminal(stdout) {
			if key, rows, rest, ok := listResult(buf.Bytes()); ok {
				renderTable(stdout, key, rows, rest)
				return nil
			}
		}
		buf.WriteByte('\n')
		_, _ = stdout.Write(buf.Bytes())
		return nil
	}
	return cmd
}

// buildArgs turns the set flags and the positional into the args map.
func buildArgs(op api.Operation, values map[string]*argValue, posArgs []string) (map[string]any, error) {
	args := map[string]any{}
	for name, v := range values {
		if v.set {
			args[name] = v.value
		}
	}
	if len(posArgs) == 1 {
		pos, _ := op.PositionalArg()
		if _, dup := args[pos.Name]; dup {
			return nil, usage("%s given both as --%s and positionally", pos.Name, kebab(pos.Name))
		}
		x, err := parseArg(pos, posArgs[0])
		if err != nil {
			return nil, usage("%s: %v", pos.Name, err)
		}
		args[pos.Name] = x
	}
	for _, a := range op.Args {
		if _, ok := args[a.Name]; a.Required && !ok {
			return nil, &exitError{code: ExitUsage, err: api.Errorf(api.KindInvalidRequest, map[string]any{"arg": a.Name}, "--%s is required for %s", kebab(a.Name), op.Name)}
		}
	}
	return args, nil
}

func resolveScope(group string, op api.Operation, g *globals) (jsonl.Scope, error) {
	switch {
	case op.Scope == api.ScopeSystem:
		return jsonl.SystemScope(), nil
	case g.sandboxID != "":
		return jsonl.SandboxScope(g.sandboxID), nil
	case op.Scope == api.ScopeEither:
		return jsonl.SystemScope(), nil
	}
	return jsonl.Scope{}, &exitError{code: ExitUsage, err: api.Errorf(api.KindInvalidRequest, map[string]any{"arg": "sandbox_id"}, "--sandbox-id is required for %s", op.Name)}
}

func newClient(g *globals) (*client.Client, error) {
	c, err := client.Resolve(g.endpoint, g.token)
	if err != nil {
		return nil, &exitError{code: ExitUsage, err: api.Errorf(KindConfig, nil, "%v", err)}
	}
	return c, nil
}
