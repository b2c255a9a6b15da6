#!/usr/bin/env bash
# Provisions the headless browser of the web view's test: Debian's chromium package.
# Idempotent: does nothing when a chromium binary is already on PATH (or $CAIRN_CHROMIUM).
set -euo pipefail
if [ -n "${CAIRN_CHROMIUM:-}" ] && [ -x "$CAIRN_CHROMIUM" ]; then
  exit 0
fi
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
echo "cairn: provisioning headless Chromium for the web view test (Debian package chromium, ~100 MB)" >&2
sudo=""
if [ "$(id -u)" != "0" ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >&2 || true
$sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
command -v chromium >/dev/null 2>&1
echo "cairn: chromium ready ($(chromium --version 2>/dev/null | head -1))" >&2
