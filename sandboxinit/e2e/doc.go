// Package e2e holds the daemon's end-to-end tests: the real sandbox-daemon
// binary, statically linked, copied into a container of a locally built image
// (busybox-static and debootstrapped Debian), created the way the product
// creates sandboxes (explicit capabilities, seccomp profile, state volume,
// loopback-published port), and driven over its RPC.
package e2e
