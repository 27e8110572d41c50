#!/usr/bin/env bash
# Builds the images the end-to-end tests use, locally (no registry is reachable):
#   eos-test-busybox:1   a busybox-static root
#   eos-test-debian:1    debootstrap minbase bookworm with git and python3
# Each image is built once and cached by tag.
set -euo pipefail
need() { command -v "$1" >/dev/null 2>&1 || { export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; apt-get install -y -qq "$2" >/dev/null; }; }

if ! docker image inspect eos-test-busybox:1 >/dev/null 2>&1; then
  need busybox busybox-static
  [ -x /bin/busybox ] && file /bin/busybox | grep -q static || { apt-get install -y -qq busybox-static >/dev/null; }
  dir=$(mktemp -d)
  mkdir -p "$dir"/{bin,sbin,etc,tmp,proc,sys,dev,root,workspace,usr/bin,usr/sbin,var}
  cp /bin/busybox "$dir/bin/busybox"
  for a in $("$dir/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$dir/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' >"$dir/etc/passwd"
  echo 'root:x:0:' >"$dir/etc/group"
  chmod 1777 "$dir/tmp"
  tar -C "$dir" -c . | docker import - eos-test-busybox:1 >/dev/null
  rm -rf "$dir"
  echo "built eos-test-busybox:1"
fi

if ! docker image inspect eos-test-debian:1 >/dev/null 2>&1; then
  need debootstrap debootstrap
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)
  dir=$(mktemp -d)
  debootstrap --variant=minbase --include=git,python3,ca-certificates bookworm "$dir" "$mirror" >/tmp/debootstrap.log 2>&1 || {
    tail -20 /tmp/debootstrap.log >&2; exit 1; }
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  mkdir -p "$dir/workspace"
  tar -C "$dir" -c . | docker import - eos-test-debian:1 >/dev/null
  rm -rf "$dir"
  echo "built eos-test-debian:1"
fi
