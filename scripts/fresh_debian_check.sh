#!/usr/bin/env bash
# Runs the README's two commands on a plain Debian: inside a container of the base scripts/docker_base.sh
# gives (python3, venv, pip and CA certificates, nothing else), as root, on the committed tree at HEAD
# (`git archive`: what a fresh clone holds; no .venv, no var/, no uncommitted edits). Whatever this
# machine happens to have installed (libnuma1, git, curl, compilers) is not there, so a missing install
# step fails here.
#   scripts/fresh_debian_check.sh                 bash scripts/demo.sh, then bash scripts/test.sh
#   scripts/fresh_debian_check.sh -- PYTEST_ARGS  the same, pytest limited to PYTEST_ARGS (every install
#                                                 step, the fixture model and the lint still run)
# Needs Docker (scripts/dockerd.sh start). The container runs on the host's network (PyPI, Debian's
# archive) with vLLM's shared memory; its output goes to stdout and var/fresh-debian/run.log, the demo's
# server logs to var/fresh-debian/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--" ] && shift
BASE=$(bash scripts/docker_base.sh)
mkdir -p var/fresh-debian
name="faithproxy-fresh-debian-$$"
tests=""
[ $# -gt 0 ] && tests=$(printf ' %q' "$@")  # none: the whole suite (printf would give '' for no arguments)
echo "base $BASE; container $name; pytest arguments:${tests:- (all)}"
# the servers' logs (vLLM's, the proxy's) come out before the container goes, whatever the outcome
trap 'docker cp "$name:/repo/var/demo" var/fresh-debian/ >/dev/null 2>&1 || true; docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
echo "tree: $(git rev-parse --short HEAD)"
git archive --format=tar HEAD \
  | docker run -i --name "$name" --network host --shm-size 1g "$BASE" bash -c "
      set -euo pipefail
      mkdir /repo && tar -x -C /repo && cd /repo
      echo '== bash scripts/demo.sh'
      bash scripts/demo.sh
      echo '== bash scripts/test.sh$tests'
      bash scripts/test.sh$tests
    " 2>&1 | tee var/fresh-debian/run.log
