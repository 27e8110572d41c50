// Package hostpath is the one rule for host paths a caller names: the
// workspace a sandbox is created from (create_sandbox's workspace_root) and
// the destination of an export (export_changes' dest). The gateway checks
// them before a workflow starts and the activities check them again when
// they run, as if a stranger had sent them through Temporal.
//
// Invariants of an accepted path:
//   - absolute, with no "." or ".." component;
//   - canonical: no component that exists is a symlink (the check walks the
//     path with Lstat from "/"; components that do not exist yet are allowed
//     for a destination, and created later without following links);
//   - at or below one of the policy's allowed roots (themselves resolved
//     once, when the policy is built);
//   - not "/", not at or below /etc, /proc, /sys, /dev or /boot, and neither
//     at, below nor above a protected directory (the state dir with the
//     gateway secret and token): copying a parent of it in would hand the
//     secret to a sandbox, exporting over it would replace it.
//
// A refusal is a *Error naming the rule (Rule) and the path. The package
// imports nothing of Temporal, Docker or gin: both sides use it.
package hostpath
