#!/usr/bin/env bash
# Builds every image the repo defines, FROM the base scripts/docker_base.sh gives (python:3.11-slim, or a
# Debian-made one when no registry answers):
#   proxy        faithproxy:$FAITHPROXY_VERSION             Dockerfile
#   vllm-cpu     faithproxy-vllm-cpu:$FAITHPROXY_VERSION    deploy/vllm-cpu/Dockerfile (the slow one)
#   vllm-router  faithproxy-vllm-router:$VLLM_ROUTER_VERSION deploy/vllm-router/Dockerfile
#   prometheus   faithproxy-local/prometheus:debian         deploy/local-images/prometheus (Debian's package)
#   redis        faithproxy-local/redis:debian              deploy/local-images/redis (Debian's package)
# The last two stand in for prom/prometheus and redis where Docker Hub is out of reach; the compose file
# takes them through PROMETHEUS_IMAGE and REDIS_IMAGE.
# Usage: scripts/build_images.sh [IMAGE...]   (default: all five; names as in the first column)
# Tags are the ones deploy/docker-compose.yml uses, so `docker-compose up` finds them built.
# Builds use the classic builder (as docker-compose 1.29 does: it reads only the root .dockerignore)
# and the host's network (PyPI and Debian's archive through this machine's setup). A summary of sizes
# goes to var/docker/images.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${FAITHPROXY_VERSION:-0.1.0}
ROUTER_VERSION=${VLLM_ROUTER_VERSION:-0.1.17}
# One build at a time on this machine: a second caller (another test session) waits, then finds every
# layer cached instead of building the same vLLM image beside the first.
mkdir -p var/docker
exec 9>var/docker/build.lock
flock 9
BASE=$(bash scripts/docker_base.sh)
echo "base image: $BASE"
export DOCKER_BUILDKIT=0
build() { nice docker build --network host --build-arg BASE="$BASE" "$@"; }

images=("$@")
[ ${#images[@]} -gt 0 ] || images=(proxy vllm-cpu vllm-router prometheus redis)
tags=()
for image in "${images[@]}"; do
  start=$(date +%s)
  case "$image" in
  proxy)
    tag=faithproxy:$VERSION
    build --build-arg VERSION="$VERSION" -t "$tag" . ;;
  vllm-cpu)
    tag=faithproxy-vllm-cpu:$VERSION
    build -f deploy/vllm-cpu/Dockerfile -t "$tag" . ;;
  vllm-router)
    tag=faithproxy-vllm-router:$ROUTER_VERSION
    build --build-arg VLLM_ROUTER_VERSION="$ROUTER_VERSION" -t "$tag" deploy/vllm-router ;;
  prometheus)
    tag=faithproxy-local/prometheus:debian
    build -t "$tag" deploy/local-images/prometheus ;;
  redis)
    tag=faithproxy-local/redis:debian
    build -t "$tag" deploy/local-images/redis ;;
  *)
    echo "unknown image $image (proxy, vllm-cpu, vllm-router, prometheus, redis)" >&2
    exit 2 ;;
  esac
  echo "built $tag in $(($(date +%s) - start)) s"
  tags+=("$tag")
done

{
  echo "base $BASE: $(docker image inspect -f '{{.Size}}' "$BASE") bytes"
  for tag in "${tags[@]}"; do
    echo "$tag: $(docker image inspect -f '{{.Size}}' "$tag") bytes; largest layers:"
    docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$tag" \
      | sort -h -r | head -4 | cut -c1-160 | sed 's/^/  /'
  done
} | tee var/docker/images.txt
