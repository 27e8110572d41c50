#!/usr/bin/env bash
# Installs and starts a Docker Engine when none answers. Idempotent.
set -euo pipefail
sock=/var/run/docker.sock
if docker version >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi
if ! docker version >/dev/null 2>&1; then
  mkdir -p /var/log
  nohup dockerd >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    if docker version >/dev/null 2>&1; then break; fi
    sleep 1
  done
fi
docker version --format 'docker engine {{.Server.Version}} (API {{.Server.APIVersion}})' || {
  echo "dockerd did not start; see /var/log/dockerd.log" >&2
  tail -20 /var/log/dockerd.log >&2 || true
  exit 1
}
