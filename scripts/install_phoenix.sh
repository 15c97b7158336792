#!/usr/bin/env bash
# Installs Arize Phoenix, an OpenTelemetry collector and UI that people use to look at LLM traces, into
# its own venv (.venv-phoenix): tests/integration/test_phoenix.py starts `phoenix serve` from there,
# sends it faithproxy's spans over OTLP and reads them back through its REST API. Its own venv because
# Phoenix pins its own versions of packages the main venv (vLLM's) needs others of. The version is the
# one the test was written against. Idempotent: does nothing when that version is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PHOENIX_VENV:-.venv-phoenix}
VERSION=${PHOENIX_VERSION:-20.26.1}
PYTHON=${PYTHON:-python3}
if [ -x "$VENV/bin/phoenix" ] && "$VENV/bin/python" - "$VERSION" <<'PY'
import importlib.metadata, sys
sys.exit(importlib.metadata.version("arize-phoenix") != sys.argv[1])
PY
then
  echo "arize-phoenix $VERSION already installed in $VENV"; exit 0
fi
# The machine's pip config may point at a local package index meant for the vLLM venv.
[ -x "$VENV/bin/python" ] || PIP_CONFIG_FILE=/dev/null "$PYTHON" -m venv "$VENV"
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q "arize-phoenix==$VERSION"
"$VENV/bin/python" -c "import importlib.metadata as m; print('installed: arize-phoenix', m.version('arize-phoenix'))"
