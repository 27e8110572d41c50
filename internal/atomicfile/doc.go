// Package atomicfile writes small files so that no reader, and no crash,
// ever sees them half written. It is the one implementation the daemon,
// the layer store, the gateway's token and the setup commands share; it
// imports nothing of this module.
//
// Invariants:
//   - The data goes to a temp file in the target's own directory, named
//     uniquely (renameio: "."+name+random, created O_EXCL), so two writers
//     of one file never share a temp file and the final rename never
//     crosses a file system.
//   - The temp file is fsynced and gets its mode before it takes the
//     target's name, and the directory is fsynced after, so after a crash
//     the name holds the old content or the new, whole, and the change is
//     durable once the call returns.
//   - An existing target is never truncated or written in place; a failed
//     write leaves it untouched and removes the temp file.
//   - Create never replaces: it links the finished temp file to the name,
//     so of two concurrent creators exactly one wins and the other sees
//     the winner's file whole (fs.ErrExist).
//   - WriteFiles keeps each file's guarantees with the disk waits of all of
//     them side by side; it promises no order between them after a power
//     cut (only that each is old or new, whole).
package atomicfile
