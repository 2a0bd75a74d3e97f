#!/usr/bin/env bash
# Debian's headless Chromium for the browser tests (Playwright drives it; it never downloads one).
#   scripts/browser.sh        installs /usr/bin/chromium if it is missing (needs root or sudo)
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
/usr/bin/chromium --version
