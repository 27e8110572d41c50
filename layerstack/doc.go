// Package layerstack is the on-disk layer store every sandbox stands on: the
// project's history as a stack of immutable overlay layers, the leases that
// pin them for workspace sessions, and the all-or-nothing publish that turns
// a session's change set into the next layer.
//
// Layout under the store root:
//
//	manifest.json   the head: layer ids newest first, schema-versioned
//	base/<B-hash>/  content-addressed base layers (shareable between stores)
//	layers/<id>/    published (L...) and squashed (S...) layers, overlay format
//	meta/<id>.json  per-layer metadata: owner, txid, digest, counts, blame
//	leases/         persisted leases (they survive a daemon restart)
//	txns/           one record per committed transaction id
//	staging/        work in progress; cleared at open
//	audit.ndjson    who published what, when
//
// Invariants:
//
//   - Layers are immutable once renamed out of staging. Overlay mounts use
//     them directly as lower dirs (kernel whiteouts, opaque xattrs).
//   - The manifest is replaced atomically (temp file, fsync, rename, fsync
//     dir). Its rename is the only commit point: a layer exists for readers
//     exactly when the manifest names it. A publish writes the next manifest
//     in staging and flushes it in one batch with the layer, its rename
//     into layers/ and its metadata, so the rename names only durable data.
//     A caller's own record of the publish (CommitRecord) joins that batch:
//     it is on disk whenever the commit is, and one a crash left before the
//     rename is void unless Committed says the txid committed.
//   - What a committed publish leaves in staging (its frozen copies, also
//     linked into the layer) is removed after Publish returns; Verify and
//     Close wait for that, and the open's clearing of staging finishes it
//     after a crash.
//   - A transaction record is written after the commit without an fsync: it
//     is derivable from the committed layer's metadata (the boot sweep
//     rewrites a lost or torn one), and a squash makes the records of the
//     layers it folds durable before its manifest drops their txids.
//   - A commit is keyed by a transaction id. The same id committed twice
//     returns the first result and writes nothing.
//   - A publish either commits the whole resolved change set as one layer or
//     commits nothing and reports every conflicting path. A change set with
//     no effective change commits no layer.
//   - Paths are checked per path against what the head published since the
//     session's base; text files changed on both sides merge at line level.
//     Gitignored paths (judged on the base) are last-writer-wins.
//   - A layer is deleted only when neither the manifest nor any lease names
//     it, and never while a reader holds the GC read lock. The boot sweep
//     deletes nothing when the manifest cannot be read.
//   - One process owns a store (flock on .lock); inside it, commits are
//     serialised. Resolution and the layer's build may run outside the
//     commit lock against a pinned head. If the head moved meanwhile, they
//     are redone, unless every commit since was a publish that touched no
//     path of the change set, nor a directory above or a path below one:
//     then the built layer is committed on the new head as it is.
//   - Every write's content is copied (and hashed) into staging before it is
//     checked: what is checked is what is committed.
//   - An upper dir is read only by descriptors (Capture, Dir): no symlink in
//     any component is followed and a source is fstat'ed as a regular file
//     before it is streamed, so a session swapping paths under a capture
//     cannot get a byte from outside its upper dir into a layer. Errors name
//     layer paths, never where the upper dir lives.
package layerstack
