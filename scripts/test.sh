#!/usr/bin/env bash
# The test command of the README: installs what is missing, builds the fixture model, lints, tests.
# pytest's exit code 5 (no tests collected) fails this script like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/install_prometheus.sh  # Debian's prometheus + promtool, for tests/deploy
bash scripts/install_redis.sh  # Debian's redis-server, for the shared-reports tests (tests/server/test_reports.py, tests/integration/test_reports_redis.py)
bash scripts/install_litellm.sh  # LiteLLM's proxy in .venv-litellm, for tests/integration/test_behind_litellm.py
bash scripts/install_router.sh  # vllm-router in .venv-router, for tests/integration/test_replicas.py
bash scripts/install_chromium.sh  # Debian's chromium + chromium-driver, for tests/server/test_report_page.py
bash scripts/install_phoenix.sh  # Arize Phoenix in .venv-phoenix, for tests/integration/test_phoenix.py
bash scripts/build_fixture_model.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest "$@"
