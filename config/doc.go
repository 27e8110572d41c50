// Package config reads the seed's gateway YAML: the file named by
// SANDBOX_GATEWAY_CONFIG_YAML (or the gateway's --config flag) and the
// daemon YAML its manager.docker.daemon_config_yaml_path points to.
//
// Invariants:
//   - Only keys that mean something here are applied (Applied lists them);
//     every other key of the seed's document configures the seed's Rust
//     internals and is ignored, named once in Ignored so the caller can warn.
//   - A key we use with a malformed value is refused with an error naming
//     the key and the accepted range; nothing is silently clamped.
//   - The daemon YAML governs sandboxes created afterwards: its settings
//     become sandbox-daemon flags baked into each new container (existing
//     sandboxes keep theirs, as in the seed).
//   - A daemon YAML without runtime.layerstack.autosquash_policies turns
//     autosquash off (the seed's runtime suite relies on this); without any
//     daemon YAML the product default (squash past 100 layers) applies.
package config
