// Command sandbox-runtime-cli runs runtime operations of one sandbox through the gateway.
package main

import (
	"os"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/cli"
)

func main() { os.Exit(cli.Main(api.GroupRuntime, os.Args[1:], os.Stdout, os.Stderr)) }
