// Command sandbox-observability-cli runs observability (read-only) operations through the gateway.
package main

import (
	"os"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/cli"
)

func main() { os.Exit(cli.Main(api.GroupObservability, os.Args[1:], os.Stdout, os.Stderr)) }
