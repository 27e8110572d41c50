// Command sandbox-manager-cli runs management operations through the gateway.
package main

import (
	"os"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/cli"
)

func main() { os.Exit(cli.Main(api.GroupManagement, os.Args[1:], os.Stdout, os.Stderr)) }
