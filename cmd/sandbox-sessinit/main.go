// Command sandbox-sessinit is a workspace session's PID 1 (package
// sandboxinit/runtime/sessinit): the small process that holds an idle
// session's namespaces, reaps its orphans and forks its commands for the
// daemon. The daemon starts it from /usr/local/lib/eos/sandbox-sessinit
// when the gateway shipped it next to the daemon binary, and falls back to
// its own binary as "sessinit" otherwise. It refuses to run anywhere but
// as PID 1 of a pid namespace.
package main

import (
	"os"

	"github.com/ephemeral-sandbox/sandbox/sandboxinit/runtime/sessinit"
)

func main() { os.Exit(sessinit.Main(os.Args[1:])) }
