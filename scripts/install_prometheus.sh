#!/usr/bin/env bash
# Installs Prometheus and promtool from Debian's `prometheus` package, for tests/deploy (the live
# dashboard/rules test starts its own Prometheus on 127.0.0.1; nothing else is configured).
# Idempotent: does nothing when both binaries are on PATH. Needs root (or sudo) for apt-get.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  echo "prometheus already installed: $(prometheus --version 2>&1 | head -n 1)"; exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Without recommends: no node exporter or other daemons. In a container the package's service is
# not started (no init); on a host with systemd it would start on :9090, which the tests never use.
$SUDO apt-get install -y -q --no-install-recommends prometheus
prometheus --version 2>&1 | head -n 1
promtool --version 2>&1 | head -n 1
