#!/usr/bin/env bash
# The compose stack's scale-out profile, built and started in Docker and checked: a report written
# through one proxy is read through the other, and a vLLM container killed mid-chain costs a verified
# stream nothing (tests/deploy/test_stack_scale_out.py). Outside CI: five containers with two vLLM
# engines take longer than CI's budget beside the cpu profile (deploy/README.md).
# Needs .venv (scripts/install.sh) for pytest and the OpenAI SDK; starts dockerd when none answers and
# stops it again afterwards. Leaves no container, network or volume behind (`down -v`).
set -euo pipefail
cd "$(dirname "$0")/.."
started=""
if ! docker info >/dev/null 2>&1; then
  bash scripts/dockerd.sh start
  started=1
fi
[ -z "$started" ] || trap 'bash scripts/dockerd.sh stop' EXIT
FAITHPROXY_CONTAINER_TESTS=1 FAITHPROXY_STACK_SCALE_OUT=1 .venv/bin/python -m pytest tests/deploy/test_stack_scale_out.py -v -s "$@"
