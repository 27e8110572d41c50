#!/usr/bin/env bash
# Node.js >= 20 and npm, for rebuilding the console bundle (make console) and
# its unit tests (npm test); building and running the Go code never needs
# them. Uses the machine's node when it is new enough, else tries Debian's
# packages, and fails with a clear message when that is still too old
# (Vite 7 needs Node 20.19+). Idempotent.
set -euo pipefail
new_enough() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 &&
    node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=19)?0:1)'
}
new_enough && exit 0
if ! command -v node >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi
new_enough || { echo "the console build needs Node.js >= 20.19 and npm (found: $(node --version 2>/dev/null || echo none))" >&2; exit 1; }
