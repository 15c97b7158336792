#!/usr/bin/env bash
# Installs Debian's chromium and chromium-driver, for tests/server/test_report_page.py (the report
# page rendered in a real headless browser, driven by selenium from .venv's dev extra).
# Idempotent: does nothing when both binaries are on PATH. Needs root (or sudo) for apt-get.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  echo "chromium already installed: $(chromium --version 2>/dev/null | head -n 1)"; exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Without recommends: no fonts beyond the default set, no desktop integration; the test runs headless.
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver
chromium --version 2>/dev/null | head -n 1
chromedriver --version | head -n 1
