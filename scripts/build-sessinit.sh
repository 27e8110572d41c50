#!/usr/bin/env bash
# Builds the session init (cmd/sandbox-sessinit/sessinit.c): one static C
# binary, the process an idle session is. Usage: build-sessinit.sh OUT
set -euo pipefail
out=${1:?usage: build-sessinit.sh OUT}
src="$(cd "$(dirname "$0")/.." && pwd)/cmd/sandbox-sessinit/sessinit.c"
${CC:-cc} -std=gnu11 -O2 -static -s -Wall -Wextra -Werror -o "$out" "$src"
