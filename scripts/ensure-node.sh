#!/usr/bin/env bash
# Node.js and npm for rebuilding the console bundle (make console) and its
# unit tests (npm test); building and running the Go code never needs them.
# Uses the machine's node when it is >= 20, else Debian's packages. Idempotent.
set -euo pipefail
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  major=$(node -p 'process.versions.node.split(".")[0]')
  [ "$major" -ge 20 ] && exit 0
  echo "node $(node --version) is older than 20" >&2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq nodejs npm >/dev/null
echo "installed nodejs $(node --version), npm $(npm --version)"
