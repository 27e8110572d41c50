//go:build tools

// Package tools pins the Temporal server and its SQL tool for
// scripts/cluster (go build go.temporal.io/server/cmd/server,
// go.temporal.io/server/cmd/tools/sql).
package tools

import (
	_ "go.temporal.io/server/cmd/server"
	_ "go.temporal.io/server/cmd/tools/sql"
)
