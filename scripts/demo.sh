#!/usr/bin/env bash
# The README's first command: install everything into .venv, then run `faithproxy demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/faithproxy demo "$@"
