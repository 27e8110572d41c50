// Package testenv gives end-to-end tests what they need from the machine:
// a reachable Docker Engine, the locally built test images, and the static
// sandbox-daemon binary, built once per test process.
//
// Invariants: a missing prerequisite fails the test with the command that
// provides it; nothing here skips.
package testenv
