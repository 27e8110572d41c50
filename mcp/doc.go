// Package mcp is the MCP server of Ephemeral Sandbox (on
// github.com/mark3labs/mcp-go): one tool group per server — management,
// runtime or observability — projected from the operation catalog (api/),
// served over stdio (cmd/sandbox-mcp) or streamable HTTP (the gateway's
// /mcp/<set>).
//
// Invariants:
//   - Tools are the catalog's public operations of the set, with the
//     catalog's names, arguments, defaults and limits; nothing is declared
//     here twice. The runtime set requires sandbox_id on every tool; in the
//     observability set sandbox_id follows the operation's scope (required
//     for sandbox-scope views, optional for the fleet forms).
//   - Every call returns a tool result, never a protocol error: success
//     carries the gateway's JSON as structuredContent plus a text rendering;
//     failure sets isError and carries the error envelope
//     {error:{kind,message,details}} the same two ways.
//   - Progress reaches the client only when it asked for it (a progress
//     token): the gateway's progress frames (create, publish, export stages;
//     command output lines) become notifications/progress, coalesced so a
//     chatty command cannot flood the client.
//   - Over stdio nothing but protocol is written to stdout; logs go to
//     stderr.
//
// The import alias for mark3labs/mcp-go/mcp is mcplib, for its server
// package mcpserver, everywhere in this repository.
package mcp
