// Package spreaddir asks the file system to place the directories made in
// a directory far apart: on ext2/3/4 it sets the directory's "top of a
// directory hierarchy" flag (FS_TOPDIR_FL, chattr +T), so each new
// subdirectory gets the Orlov allocator's pick of a block group instead of
// its parent's.
//
// Why: on ext4 without a journal (seen on this project's VMs), the kernel
// does not reuse an inode freed in the last 60 s (360 s while its inode
// table block is dirty), and every new inode is found by scanning its group
// from the start past those recently freed ones (ialloc.c,
// recently_deleted). The daemon frees and creates thousands of inodes a
// minute in a few parents (sessions, staging, the runtime's state, an
// import's tree); left in their parents' groups, each create scanned the
// same groups' freed inodes again, so a create cost grew with the churn of
// the last minutes (measured: extracting the same 40,000-file tar took 0.6
// s, then 13 s after a few rounds of create and delete; with the flag on
// the root, 0.6 to 1.2 s every round). With a journal the scan does not
// happen, and the flag only spreads the directories.
//
// Invariants:
//   - Spread never fails a caller: a file system without the flag, or a
//     process not allowed to set it, leaves the directory as it was, and
//     the answer says so.
//   - It changes where new subdirectories go, never what a directory holds
//     or who may read it; the flag is not inherited by the subdirectories.
package spreaddir
