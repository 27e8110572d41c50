// Package api holds the wire types shared by the gateway, the daemon and the
// clients: one request and one result type per operation, with the seed's
// JSON field names, and the error envelope. The operation catalog that drives
// routes, CLI commands and MCP tools grows here.
//
// Invariants: field names and result shapes follow the seed contract
// (shared/reference/seed-contract.md §0.3) so seed clients work unchanged;
// additions are new optional fields, never renames.
package api
