// Package archive applies layer tar streams to host directories.
//
// ApplyTar takes a tar or tar.zst stream produced inside a sandbox and
// applies it to a directory on the host. The stream is hostile input, so two
// design choices keep it from doing anything but what a well-formed layer may
// do:
//
//   - The whole stream is validated before dest is touched. Headers are
//     checked one by one while regular-file contents are spooled to an
//     unlinked temp file; only when the stream ended cleanly (end-of-archive
//     marker present, every rule satisfied, limits respected, no entry would
//     be written through a symlink that exists in dest) does the apply phase
//     start, reading contents back from the spool. A truncated, corrupt or
//     malicious stream is therefore rejected as a unit with
//     ApplyError{Phase: "validate"} and leaves dest exactly as it was, instead
//     of leaving a half-applied layer behind.
//
//   - The apply phase never resolves a path with the ordinary path walk. It
//     opens dest once and resolves every parent directory relative to that
//     descriptor with openat2(2) and RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
//     RESOLVE_NO_MAGICLINKS, then creates, replaces and deletes entries with
//     *at system calls and O_NOFOLLOW/AT_SYMLINK_NOFOLLOW. The kernel thus
//     refuses to follow any symlink or ".." out of dest, even one that was
//     planted or swapped in after validation (a lexical check alone is
//     subject to that race).

package archive
