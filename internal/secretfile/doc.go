// Package secretfile keeps a deployment's random secrets in files: the
// gateway's token (api/client) and the secret every daemon token derives
// from (worker). It imports nothing of this module but atomicfile.
//
// Invariants:
//   - A secret file holds 32 random bytes as 64 hex characters and a
//     newline, mode 0600, in a directory created 0700.
//   - It is created once, whole (atomicfile.Create): no reader ever sees it
//     empty or half written, a crash leaves no file or the whole one, and
//     of concurrent first starts exactly one creates it while the others
//     read that one, so they all agree on the secret.
//   - An existing file is never rewritten. How it is read and checked (its
//     mode, its length, the error messages) is the caller's.
package secretfile
