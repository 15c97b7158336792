#!/usr/bin/env bash
# Installs Debian's `redis-server` (and redis-cli), for the shared-reports test
# (tests/integration/test_reports_redis.py starts its own redis-server on 127.0.0.1, on a free port;
# nothing else is configured). Idempotent: does nothing when redis-server is on PATH. Needs root (or
# sudo) for apt-get.
set -euo pipefail
if command -v redis-server >/dev/null; then
  echo "redis-server already installed: $(redis-server --version)"; exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Without recommends. In a container the package's service is not started (no init); on a host with
# systemd it would start on :6379, which the tests never use.
$SUDO apt-get install -y -q --no-install-recommends redis-server
redis-server --version
