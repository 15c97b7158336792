#!/usr/bin/env bash
# Installs LiteLLM's proxy, the gateway many teams run in front of their models, into its own venv
# (.venv-litellm): the gateway tests (tests/integration/test_behind_litellm.py) and the overhead
# benchmark start it from there. Its own venv because `litellm[proxy]` pins versions of packages
# vLLM needs others of (huggingface_hub among them). The version is the one the tests were written
# against: a gateway that changes what it forwards must be noticed, not picked up silently.
# Idempotent: does nothing when that version is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LITELLM_VENV:-.venv-litellm}
VERSION=${LITELLM_VERSION:-1.108.7}
PYTHON=${PYTHON:-python3}
if [ -x "$VENV/bin/litellm" ] && "$VENV/bin/python" - "$VERSION" <<'PY'
import importlib.metadata, sys
sys.exit(importlib.metadata.version("litellm") != sys.argv[1])
PY
then
  echo "litellm $VERSION already installed in $VENV"; exit 0
fi
# The machine's pip config may point at a local package index meant for the vLLM venv.
[ -x "$VENV/bin/python" ] || PIP_CONFIG_FILE=/dev/null "$PYTHON" -m venv "$VENV"
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q "litellm[proxy]==$VERSION"
"$VENV/bin/python" -c "import importlib.metadata as m; print('installed: litellm', m.version('litellm'))"
