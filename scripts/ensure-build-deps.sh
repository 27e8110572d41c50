#!/usr/bin/env bash
# Installs the Debian packages the static daemon build needs. Idempotent.
#   libseccomp-dev   libseccomp.a and seccomp.h: the daemon is built with the
#                    "seccomp" tag so libcontainer gives every session its own
#                    seccomp filter (sandboxinit/runtime/seccomp.go).
#   gcc libc6-dev    cgo and the static link of the daemon, and the session
#                    init (cmd/sandbox-sessinit/sessinit.c, static C).
set -euo pipefail
pkgs=(libseccomp-dev gcc libc6-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
echo "installed ${missing[*]}"
