#!/usr/bin/env bash
# Installs Debian's chromium for the console's browser tests
# (cmd/sandbox-gateway/console_browser_test.go drives it with chromedp).
# Never downloads a browser from anywhere else. Idempotent.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
echo "installed chromium"
